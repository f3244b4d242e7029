"""The sidebar's TypeScript message types (extensions/src/api.ts) say what the server sends.

The field lists are read from the server's own code with `ast` (nothing is imported or faked):
each serializer of `tgnb.server.serialize` (the dict it builds, the keys it sets under an ``if``,
what a ``**call()`` it spreads returns) and each message of the event stream (a dict literal with
a ``"type"`` in `tgnb.server`). They are compared with api.ts's interfaces and its `Message` union,
parsed: a field one side has and the other lacks, a key sent only sometimes that TypeScript calls
required, or a nested serializer's output typed as another interface, fails with the line to fix.
A new interface or serializer fails until it is paired in `PAIRS`. The values are checked too:
the serializers' JSON of real records (a cluster with nodes and prices, a run in a real store with
its metrics, events and history, events) must have the types api.ts declares.
"""

from __future__ import annotations

import ast
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

import tgnb

PACKAGE = Path(tgnb.__file__).parent
API_TS = PACKAGE.parent / "extensions" / "src" / "api.ts"
SERIALIZE = PACKAGE / "server" / "serialize.py"

#: api.ts interface -> (serializer in tgnb/server/serialize.py, where its dict is built there):
#: "return" for what the function builds, "append" for the dict it appends to a list (an entry),
#: a key of what it builds for the dict (or list of dicts) written under that key.
PAIRS: dict[str, tuple[str, str]] = {
    "INode": ("node_json", "return"),
    "ICluster": ("cluster_json", "return"),
    "IPrices": ("_prices_json", "return"),
    "IRun": ("run_json", "return"),
    "IEvent": ("event_json", "return"),
    "ILeftover": ("leftovers_json", "append"),
    "IRunChange": ("run_json", "history"),
    "ISweep": ("sweep_json", "return"),
    "ISweepRow": ("sweep_json", "rows"),
}

#: Serializers whose output is no interface of its own (why).
UNPAIRED: dict[str, str] = {
    "leftovers_json": "the GET /tgnb/posttraining/leftovers body: getLeftovers() types it inline",
}


# -- api.ts, parsed ------------------------------------------------------------------------------
def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _top_level_split(body: str, sep: str) -> list[str]:
    """`body` split at `sep` outside braces, brackets, parentheses and angle brackets."""
    parts, depth, cur = [], 0, ""
    for c in body:
        if c in "{[(<":
            depth += 1
        elif c in "}])>":
            depth -= 1
        if c == sep and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def ts_fields(body: str) -> dict[str, tuple[str, bool]]:
    """``name?: type;`` members of an object type's body -> (type, optional)."""
    out = {}
    for member in _top_level_split(body.replace("\n", " "), ";"):
        m = re.fullmatch(r"(\w+)(\?)?\s*:\s*(.+)", member, flags=re.S)
        assert m, f"api.ts: cannot read the member {member!r}"
        out[m.group(1)] = (" ".join(m.group(3).split()), bool(m.group(2)))
    return out


def ts_interfaces(text: str) -> dict[str, dict[str, tuple[str, bool]]]:
    text = _strip_comments(text)
    found = {}
    for m in re.finditer(r"export interface (\w+)\s*\{", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found[m.group(1)] = ts_fields(text[m.end() : i - 1])
    return found


def ts_messages(text: str) -> dict[str, dict[str, tuple[str, bool]]]:
    """The variants of ``export type Message = | {type: 'x'; ...} | ...`` by their type."""
    text = _strip_comments(text)
    m = re.search(r"export type Message\s*=(.*?);\s*\n(?=\S)", text, flags=re.S)
    assert m, "api.ts has no `export type Message = ...;`"
    out = {}
    for variant in _top_level_split(m.group(1), "|"):
        assert variant.startswith("{") and variant.endswith("}"), variant
        fields = ts_fields(variant[1:-1])
        kind = re.fullmatch(r"'(\w+)'", fields["type"][0])
        assert kind, f"api.ts: a Message variant without a literal type: {variant}"
        out[kind.group(1)] = fields
    return out


# -- the server's code, read ---------------------------------------------------------------------
def _classes() -> dict[str, ast.ClassDef]:
    found: dict[str, ast.ClassDef] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, node)
    return found


CLASSES = _classes()


def _functions() -> dict[str, list[ast.FunctionDef]]:
    """The package's module-level functions by name (a name may be defined more than once)."""
    found: dict[str, list[ast.FunctionDef]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append(node)
    return found


FUNCTIONS = _functions()


class Field:
    def __init__(self, always: bool, value: ast.expr | None) -> None:
        self.always, self.value = always, value


def _dict_fields(d: ast.Dict, always: bool, params: dict[str, str]) -> dict[str, Field]:
    out: dict[str, Field] = {}
    for key, value in zip(d.keys, d.values, strict=True):
        if key is None:  # **call(): what that call returns
            out.update(_call_fields(value, params, always))
        elif isinstance(key, ast.Constant) and isinstance(key.value, str):
            out[key.value] = Field(always, value)
    return out


def _call_fields(call: ast.expr, params: dict[str, str], always: bool) -> dict[str, Field]:
    """The keys of ``param.method()`` where `param` is annotated with a tgnb class, or of
    ``function()``, a module-level function of tgnb that only one module defines."""
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
        defs = FUNCTIONS.get(call.func.id, [])
        assert len(defs) == 1, f"{ast.unparse(call)}: {len(defs)} tgnb functions of that name"
        return {k: Field(f.always and always, f.value) for k, f in built(defs[0], "return").items()}
    assert isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute), ast.unparse(call)
    owner = call.func.value
    assert isinstance(owner, ast.Name) and owner.id in params, ast.unparse(call)
    cls = CLASSES[params[owner.id]]
    method = next(
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == call.func.attr
    )
    fields = built(method, "return")
    return {k: Field(f.always and always, f.value) for k, f in fields.items()}


def built(fn: ast.FunctionDef, where: str) -> dict[str, Field]:
    """The keys `fn` builds (``where="return"``: its result; ``"append"``: the dict it appends;
    a key: the dict, or the list of dicts, under that key), each with whether every call sets it
    and its value's expression."""
    if where not in ("return", "append"):
        value = built(fn, "return")[where].value
        if isinstance(value, ast.ListComp):
            value = value.elt
        assert isinstance(value, ast.Dict), f"{fn.name}'s {where!r} is no dict literal"
        return _dict_fields(value, True, {})
    params = {
        a.arg: ast.unparse(a.annotation).strip("'\"")
        for a in fn.args.args
        if a.annotation is not None
    }
    out: dict[str, Field] = {}

    def visit(stmts: list[ast.stmt], always: bool) -> None:
        for st in stmts:
            if isinstance(st, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                for name in ("body", "orelse", "finalbody"):
                    visit(getattr(st, name, []), False)
                for handler in getattr(st, "handlers", []):
                    visit(handler.body, False)
                continue
            if where == "append":
                for node in ast.walk(st):
                    if (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Attribute)
                        and node.func.attr == "append"
                        and node.args
                        and isinstance(node.args[0], ast.Dict)
                    ):
                        out.update(_dict_fields(node.args[0], True, params))
                continue
            value = getattr(st, "value", None)
            if isinstance(st, (ast.Assign, ast.AnnAssign)):
                target = st.targets[0] if isinstance(st, ast.Assign) else st.target
                if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                    out[str(target.slice.value)] = Field(always, value)
                    continue
            if isinstance(st, ast.Return) and isinstance(value, ast.Call):
                if getattr(value.func, "id", "") == "plain_json":  # plain_json(x): x's keys
                    value = value.args[0]
                if isinstance(value, ast.Call):
                    out.update(_call_fields(value, params, always))
                    continue
            if isinstance(value, ast.Dict):
                out.update(_dict_fields(value, always, params))

    visit(fn.body, True)
    return out


def serializers() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(SERIALIZE.read_text(encoding="utf-8"))
    return {
        n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.endswith("_json")
    }


def _called(value: ast.expr | None) -> str | None:
    """The function a value calls, itself or for each item of a list (``[f(n) for n in ...]``)."""
    if isinstance(value, ast.ListComp):
        value = value.elt
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        return value.func.id
    return None


def drift(interface: str, ts: dict[str, tuple[str, bool]], py: dict[str, Field]) -> list[str]:
    """What differs between an api.ts interface and the fields its serializer builds."""
    fn = PAIRS[interface][0]
    wrong = [f"{interface}.{k}: api.ts has it, {fn} never sends it" for k in ts if k not in py]
    for key, field in py.items():
        if key not in ts:
            wrong.append(f"{interface}.{key}: {fn} sends it, api.ts lacks it")
            continue
        kind, optional = ts[key]
        if not field.always and not optional:
            wrong.append(f"{interface}.{key}: {fn} sends it only sometimes: write `{key}?:`")
        inner = _called(field.value)
        paired = {f: i for i, (f, _) in PAIRS.items()}
        if inner in paired and not re.search(rf"\b{paired[inner]}\b", kind):
            wrong.append(f"{interface}.{key}: {fn} sends {inner}'s {paired[inner]}, not {kind}")
    return wrong


def server_messages() -> dict[str, set[str]]:
    """The keys of each message of the event stream: dict literals with a ``"type"`` string."""
    out: dict[str, set[str]] = {}
    for path in sorted((PACKAGE / "server").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Dict):
                continue
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "type" not in keys:
                continue
            kind = node.values[keys.index("type")]
            if isinstance(kind, ast.Constant) and isinstance(kind.value, str):
                out.setdefault(kind.value, set()).update(str(k) for k in keys)
    return out


# -- the checks ----------------------------------------------------------------------------------
def test_every_interface_is_paired_with_its_serializer() -> None:
    interfaces = ts_interfaces(API_TS.read_text(encoding="utf-8"))
    assert sorted(set(interfaces) - set(PAIRS)) == [], "pair the new interface in PAIRS"
    assert sorted(set(PAIRS) - set(interfaces)) == [], "an interface of PAIRS left api.ts"
    unpaired = set(serializers()) - {f for f, _ in PAIRS.values()} - set(UNPAIRED)
    assert sorted(unpaired) == [], "pair the new serializer with its api.ts interface in PAIRS"


@pytest.mark.parametrize("interface", sorted(PAIRS))
def test_the_interface_has_the_fields_the_server_sends(interface: str) -> None:
    ts = ts_interfaces(API_TS.read_text(encoding="utf-8"))[interface]
    fn, where = PAIRS[interface]
    py = built(serializers()[fn], where)
    assert py, f"no field of {fn} was read: the reading of serialize.py is broken"
    assert drift(interface, ts, py) == []


def test_the_message_union_has_the_messages_the_server_sends() -> None:
    ts = ts_messages(API_TS.read_text(encoding="utf-8"))
    py = server_messages()
    assert {"cluster", "runs", "event", "detached", "error"} <= set(py), sorted(py)
    wrong = [
        f"message {t!r}: the server sends it, api.ts's Message lacks it" for t in py if t not in ts
    ]
    wrong += [f"message {t!r}: api.ts has it, the server never sends it" for t in ts if t not in py]
    for kind in set(ts) & set(py):
        if set(ts[kind]) != py[kind]:
            wrong.append(f"message {kind!r}: api.ts {sorted(ts[kind])}, server {sorted(py[kind])}")
    assert wrong == []


def test_the_checks_can_fail() -> None:
    """A field renamed on either side, a sometimes-sent key typed required, and a nested
    serializer typed as another interface are each found."""
    py = built(serializers()["node_json"], "return")
    ts = ts_interfaces(API_TS.read_text(encoding="utf-8"))["INode"]
    renamed = {("node_name" if k == "name" else k): v for k, v in ts.items()}
    assert drift("INode", renamed, py) == [
        "INode.node_name: api.ts has it, node_json never sends it",
        "INode.name: node_json sends it, api.ts lacks it",
    ]
    event = built(serializers()["event_json"], "return")
    assert event["time"].always and not event["node"].always  # Event.to_dict sets node if any
    required = {k: (t, False) for k, (t, _) in ts_interfaces(API_TS.read_text())["IEvent"].items()}
    assert "IEvent.node: event_json sends it only sometimes: write `node?:`" in drift(
        "IEvent", required, event
    )
    cluster = built(serializers()["cluster_json"], "return")
    mistyped = dict(ts_interfaces(API_TS.read_text())["ICluster"], nodes=("IRun[]", False))
    assert drift("ICluster", mistyped, cluster) == [
        "ICluster.nodes: cluster_json sends node_json's INode, not IRun[]"
    ]
    spent = built(serializers()["run_json"], "return")  # **run.spending(): Run.spending's keys
    assert {"gpu_hours", "cost_usd", "budget_usd"} <= set(spent)
    union = ts_messages(
        "export type Message =\n  | { type: 'a'; x: number }\n  | { type: 'b'; y: { z: string } };\n"
        "function f() {}\n"
    )
    assert union == {
        "a": {"type": ("'a'", False), "x": ("number", False)},
        "b": {"type": ("'b'", False), "y": ("{ z: string }", False)},
    }


# -- the values: real records through the serializers, checked against api.ts's types ------------
def conforms(
    value: Any, kind: str, interfaces: dict[str, dict[str, tuple[str, bool]]]
) -> list[str]:
    """Where `value` is not of the TypeScript type `kind` (``[]`` when it is)."""
    kind = kind.strip()
    alternatives = _top_level_split(kind, "|")
    if len(alternatives) > 1:
        errors = [conforms(value, alt, interfaces) for alt in alternatives]
        return [] if any(not e for e in errors) else [f"{value!r:.60} is not {kind}"]
    if kind.startswith("(") and kind.endswith(")"):
        return conforms(value, kind[1:-1], interfaces)
    record = re.fullmatch(r"Record<string,\s*(.+)>", kind)
    if record:
        if not isinstance(value, dict):
            return [f"{value!r:.60} is not {kind}"]
        return [e for item in value.values() for e in conforms(item, record.group(1), interfaces)]
    if kind.endswith("[]"):
        if not isinstance(value, list):
            return [f"{value!r:.60} is not {kind}"]
        return [e for item in value for e in conforms(item, kind[:-2], interfaces)]
    if kind in interfaces:
        return object_conforms(value, interfaces[kind], interfaces, kind)
    simple = {
        "null": value is None,
        "string": isinstance(value, str),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "unknown": True,
    }
    if kind in simple:
        return [] if simple[kind] else [f"{value!r:.60} is not {kind}"]
    if re.fullmatch(r"'[^']*'", kind):
        return [] if value == kind[1:-1] else [f"{value!r:.60} is not {kind}"]
    if kind.startswith("{") and kind.endswith("}"):
        if re.fullmatch(r"\{\s*\[\w+: string\]: unknown\s*\}", kind):
            return [] if isinstance(value, dict) else [f"{value!r:.60} is not {kind}"]
        return object_conforms(value, ts_fields(kind[1:-1]), interfaces, kind)
    raise AssertionError(f"api.ts: a type this check does not read: {kind}")


def object_conforms(
    value: Any, fields: dict[str, tuple[str, bool]], interfaces: Any, name: str
) -> list[str]:
    if not isinstance(value, dict):
        return [f"{value!r:.60} is not {name}"]
    wrong = [f"{name}.{k}: sent, not declared" for k in value if k not in fields]
    wrong += [
        f"{name}.{k}: required, not sent"
        for k, (_, opt) in fields.items()
        if not opt and k not in value
    ]
    for key, (kind, _) in fields.items():
        if key in value:
            wrong += [f"{name}.{key}: {e}" for e in conforms(value[key], kind, interfaces)]
    return wrong


def _cluster_state() -> Any:
    from tgnb.cloud.models import ClusterState, NodeState

    t = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    nodes = (
        NodeState("gpu-standard-1", 8, "ready", False, "n-1", (("NODE_PHASE_READY", t),)),
        NodeState("gpu-preemptible-dp-1", 8, "ready", True),
    )
    pricing = {"standard_per_gpu_hour": 3.0, "preemptible_per_gpu_hour": 1.5, "currency": "USD"}
    return ClusterState(
        "c-1", "demo", "kubernetes", "ready", "us-east", "H100", 8, 8, 8,
        standard_nodes=nodes[:1], preemptible_nodes=nodes[1:],
        phases=(("CLUSTER_PHASE_READY", t),), pricing=pricing,
    )  # fmt: skip


def _recorded_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A run in a real store whose run directory holds a program's events and metrics."""
    from tgnb.events import CHECKPOINT_SAVED, RUN_RESUMED, RUN_STARTED, SIGNAL_RECEIVED
    from tgnb.runs import Run
    from tgnb.runs.spec import RunSpec
    from tgnb.runs.store import RunStore
    from tgnb.train.record import Recorder

    store = RunStore(tmp_path / "home")
    spec = RunSpec(name="grpo-a", train={"algorithm": "grpo", "max_steps": 10})
    run_dir = tmp_path / "runs" / "grpo-a"
    rec = store.create(spec, backend="local", run_dir=run_dir)
    monkeypatch.setenv("TGNB_NODE", "gpu-preemptible-dp-1")
    r = Recorder(run_dir, run="grpo-a")
    r.event(RUN_STARTED)
    for step in range(1, 5):
        r.metric(step, reward=0.1 * step, loss=1.0 / step)
    r.event(CHECKPOINT_SAVED, step=4)
    r.event(SIGNAL_RECEIVED, "SIGTERM")
    r.event(RUN_RESUMED, step=4)
    return Run(store.get(rec.id), store)


def test_the_values_have_the_types_api_ts_declares(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tgnb.events import Event
    from tgnb.server.serialize import cluster_json, event_json, run_json

    interfaces = ts_interfaces(API_TS.read_text(encoding="utf-8"))
    t = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    run = _recorded_run(tmp_path, monkeypatch)
    samples = [
        ("ICluster", cluster_json(_cluster_state())),
        (
            "IEvent",
            event_json(Event(t, "run", "CheckpointSaved", "saved", "n-1", "a", {"step": 4})),
        ),
        ("IEvent", event_json(Event(t, "cluster", "NodeAdded"))),
        ("IRun", run_json(run)),
        ("IRun", run_json(run, detail=True)),
    ]
    assert run_json(run, detail=True)["history"], "the sample run has no history to check"
    wrong = [e for name, value in samples for e in conforms(value, name, interfaces)]
    assert wrong == []


def test_the_type_check_can_fail() -> None:
    interfaces = ts_interfaces(API_TS.read_text(encoding="utf-8"))
    from tgnb.server.serialize import cluster_json

    cluster = cluster_json(_cluster_state())
    assert conforms(cluster, "ICluster", interfaces) == []
    assert conforms({**cluster, "standard_gpus": "8"}, "ICluster", interfaces) == [
        "ICluster.standard_gpus: '8' is not number"
    ]
    nodes = [{**cluster["nodes"][0], "since": 5}]
    assert conforms({**cluster, "nodes": nodes}, "ICluster", interfaces) == [
        "ICluster.nodes: INode.since: 5 is not string | null"
    ]
    assert (
        conforms(
            {"time": 1.0, "state": "running", "detail": "", "node": None}, "IRunChange", interfaces
        )
        == []
    )
    assert (
        conforms({"time": "x"}, "IRunChange", interfaces)[0]
        == "IRunChange.state: required, not sent"
    )
