"""``%tg`` in a real IPython shell: help, settings, and bad input that raises a one-line
`UsageError` naming the fix with nothing sent (checked in the emulator's request log)."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from traitlets import TraitError

from tgnb import prices
from tgnb.emulator.testing import EmulatorHandle
from tgnb.notebook.commands import names

SUBCOMMANDS = [
    "attach",
    "clusters",
    "status",
    "scale",
    "launch",
    "runs",
    "watch",
    "logs",
    "stop",
    "events",
    "preempt",
    "certify",
    "cost",
    "sweeps",
    "sweep",
    "pt",
]


def sent(emu: EmulatorHandle) -> list[tuple[str, str]]:
    return [(r["method"], r["path"]) for r in emu.requests()]


def test_every_subcommand_has_help(ip: Any, tg: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert sorted(names()) == sorted(SUBCOMMANDS)
    ip.run_line_magic("tg", "--help")
    listing = capsys.readouterr().out
    for name in SUBCOMMANDS:
        assert f"  {name} " in listing
        ip.run_line_magic("tg", f"{name} --help")
        out = capsys.readouterr().out
        assert out.startswith(f"usage: %tg {name}"), out


def test_unknown_subcommand_suggests_the_nearest(ip: Any, tg: Any) -> None:
    with pytest.raises(UsageError, match="unknown subcommand 'stauts': did you mean 'status'"):
        ip.run_line_magic("tg", "stauts")


def test_commands_need_an_attached_cluster(ip: Any, tg: Any) -> None:
    with pytest.raises(UsageError, match=r"no cluster attached: run %tg attach"):
        ip.run_line_magic("tg", "status")


def test_usage_error_shows_no_traceback(
    ip: Any, tg: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    result = ip.run_cell("%tg launch grpo --lrr 0.1")
    assert isinstance(result.error_in_exec, UsageError)
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "unknown option '--lrr': did you mean '--lr'?" in text
    assert "Traceback" not in text


def test_settings_are_traitlets(ip: Any, tg: Any) -> None:
    ip.run_line_magic("config", "Tg.poll_interval = 0.5")
    ip.run_line_magic("config", "Tg.timezone = 'Europe/Paris'")
    ip.run_line_magic("config", "Tg.standard_price = 2.5")
    try:
        assert (tg.poll_interval, tg.timezone, tg.standard_price) == (0.5, "Europe/Paris", 2.5)
        with pytest.raises(Exception, match="not a time zone"):
            tg.timezone = "Mars/Olympus"
        with pytest.raises(Exception, match="must be > 0"):
            tg.poll_interval = 0
    finally:
        tg.poll_interval, tg.timezone, tg.standard_price = 2.0, "UTC", None


def test_cell_body_only_for_launch(ip: Any, tg: Any) -> None:
    with pytest.raises(UsageError, match="only %%tg launch has one"):
        ip.run_cell_magic("tg", "status", "x: 1")


def test_status_and_events_against_the_emulator(
    ip: Any, tg: Any, attached: EmulatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ip.run_line_magic("tg", "status")
    assert state.desired_preemptible_gpus == 0
    assert ("GET", f"/v1/compute/clusters/{state.id}") in sent(attached)
    ip.run_line_magic("tg", "events --since 2h")
    assert "REASON" in capsys.readouterr().out
    table = ip.run_line_magic("tg", "clusters")
    assert state.name in str(table)


def test_scale_not_a_multiple_of_8_sends_nothing(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    with pytest.raises(UsageError, match=r"must be a multiple of 8, got 12: try 8 or 16"):
        ip.run_line_magic("tg", "scale --preemptible 12")
    with pytest.raises(UsageError, match=r"not a number of GPUs"):
        ip.run_line_magic("tg", "scale --preemptible twelve")
    assert sent(attached) == []


def test_scale_and_wait_reaches_the_target(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    result = ip.run_line_magic("tg", "scale --preemptible 8 --wait --timeout 60s")
    assert result.reached
    assert result.state.allocated_preemptible_gpus == 8
    puts = [r for r in attached.requests() if r["method"] == "PUT"]
    assert [r["body"] for r in puts] == [{"num_preemptible_gpus": 8}]


def test_launch_with_unknown_option_sends_nothing(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    with pytest.raises(UsageError, match=r"unknown option '--stpes': did you mean '--steps'"):
        ip.run_line_magic("tg", "launch grpo --stpes 5 -o r")
    with pytest.raises(UsageError, match=r"'ppo' is neither an algorithm \(grpo, dpo, sft\)"):
        ip.run_line_magic("tg", "launch ppo")
    with pytest.raises(UsageError, match=r"unknown config key 'max_step'"):
        ip.run_line_magic("tg", "launch grpo --set max_step=3")
    assert sent(attached) == []
    assert tg.session.runs() == []
    assert "r" not in ip.user_ns


def test_launch_yaml_body_that_does_not_parse(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    body = "algorithm: grpo\nmax_steps: 5\ntrl: {learning_rate: 0.1\nseed: 1\n"
    with pytest.raises(UsageError, match=r"does not parse at line \d+, column \d+"):
        ip.run_cell_magic("tg", "launch -o r", body)
    with pytest.raises(UsageError, match=r"must be a mapping"):
        ip.run_cell_magic("tg", "launch", "- grpo\n")
    assert sent(attached) == []
    assert tg.session.runs() == []


def test_launch_on_preemptible_nodes_needs_a_target(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    """The Session's own check (target 0) comes back as a UsageError; nothing is submitted."""
    with pytest.raises(UsageError, match=r"preemptible target .* is 0"):
        ip.run_cell_magic("tg", "launch --steps 3 -o r", "algorithm: grpo\n")
    assert tg.session.runs() == []
    assert not [r for r in attached.requests() if r["method"] != "GET"]


def test_unknown_run_names_the_fix(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    for sub in ("watch", "logs", "stop"):
        with pytest.raises(
            UsageError, match=r"^%tg (watch|logs|stop): no run named .nope.: %tg runs --all lists"
        ):
            ip.run_line_magic("tg", f"{sub} nope")
    assert sent(attached) == []


def test_preempt_on_a_real_cluster_is_refused(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    """A session whose backend is Kubernetes stands for a real cluster (the emulator serves the
    API; only the backend name differs). The refusal happens before any call."""
    from tgnb.session import Session

    real = Session(tg.session.cloud, tg.session.cluster, backend="kubernetes")
    tg.session = real
    before = attached.nodes(real.cluster.id)
    with pytest.raises(UsageError, match=r"preempt works only on the local emulator"):
        ip.run_line_magic("tg", "preempt gpu-preemptible-dp-0")
    assert attached.nodes(real.cluster.id) == before
    assert sent(attached) == []


def test_runs_and_cost_with_no_runs(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    assert "no runs launched or opened in this notebook yet" in str(ip.run_line_magic("tg", "runs"))
    report = ip.run_line_magic("tg", "cost")
    assert report.total("preemptible_gpu_hours") == 0
    assert "cost $0.00 at" in str(report)


def test_cost_is_in_dollars_at_the_emulators_prices_and_config_overrides_them(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    """``%tg cost`` prices GPU-hours at what the emulator's cluster serves (its GPU type's
    published rates), and ``%config Tg.*_price`` overrides them; a bad price is refused."""
    state = tg.attached().status()
    served = prices.published(state.gpu_type)
    assert served is not None and state.pricing == served.to_api()  # served over HTTP
    report = ip.run_line_magic("tg", "cost")
    assert report.prices == prices.Prices(served.standard, served.preemptible, prices.FROM_API)
    assert f"{prices.dollars(served.standard)}/GPU-h standard" in str(report)
    assert "(from the platform's API)" in str(report)
    ip.run_line_magic("config", "Tg.preemptible_price = 0.25")
    try:
        report = ip.run_line_magic("tg", "cost")
        assert (report.prices.standard, report.prices.preemptible) == (served.standard, 0.25)
        assert "$0.25/GPU-h preemptible (from %config and the platform's API)" in str(report)
        with pytest.raises(TraitError, match=r"must be >= 0 dollars per GPU-hour.*= 2\.5"):
            tg.standard_price = -1.0
    finally:
        tg.preemptible_price = None


def test_attach_to_a_cluster_that_does_not_exist(
    ip: Any, tg: Any, attached: EmulatorHandle
) -> None:
    with pytest.raises(UsageError, match=r"^%tg attach: .*no-such-cluster"):
        ip.run_line_magic("tg", "attach no-such-cluster --local")
    assert not [r for r in attached.requests() if r["method"] != "GET"]


def test_the_api_key_appears_in_no_output(
    ip: Any, tg: Any, attached: EmulatorHandle, capsys: pytest.CaptureFixture[str]
) -> None:
    key = attached.api_key
    shown: list[str] = []
    for line in ("attach --local", "status", "clusters", "runs", "cost", "events --timeline"):
        out = ip.run_line_magic("tg", line)
        shown += [repr(out), str(out), getattr(out, "_repr_html_", lambda: "")() or ""]
    for line in ("scale --preemptible 12", "preempt", "watch nope"):
        try:
            ip.run_line_magic("tg", line)
        except UsageError as e:
            shown.append(str(e))
    captured = capsys.readouterr()
    shown += [captured.out, captured.err]
    assert all(key not in text for text in shown)


def test_watch_timeout_goes_with_wait(ip: Any, tg: Any, attached: EmulatorHandle) -> None:
    ip.run_line_magic("tg", "attach --local")
    with pytest.raises(UsageError, match=r"--timeout goes with --wait"):
        ip.run_line_magic("tg", "watch nope --timeout 5m")


@pytest.mark.parametrize(
    ("value", "says"),
    [("-5", "budget_usd must be more than 0 dollars"), ("ten", "is not a finite number")],
)
def test_a_bad_budget_is_a_one_line_usage_error(
    ip: Any, tg: Any, attached: EmulatorHandle, value: str, says: str
) -> None:
    ip.run_line_magic("tg", "attach --local")
    before = len(tg.attached().runs())
    with pytest.raises(UsageError, match=says):
        ip.run_line_magic("tg", f"launch sft --name budget-bad --budget-usd {value}")
    assert len(tg.attached().runs()) == before  # nothing recorded or submitted
