"""`import tgnb` and the notebook side must stay light: no torch, TRL, transformers or kubernetes,
nor the trackers (wandb, mlflow: imported only by a run whose ``report_to`` names them)."""

from tests.conftest import heavy_in, modules_after


def test_import_tgnb_is_light() -> None:
    loaded = modules_after(
        "import tgnb, tgnb.cli, tgnb.events, tgnb.backends, tgnb.train, tgnb.cloud, "
        "tgnb.train.tracker"
    )
    heavy = heavy_in(loaded)
    assert heavy == [], f"heavy modules imported: {heavy[:10]}"


#: The tgnb modules ``%load_ext tgnb`` imports: the magics, the table of subcommands and what the
#: router itself uses. A subcommand's module is imported when the subcommand is first used; a new
#: import here (a subcommand, `tgnb.runs`, `tgnb.tasks`, yaml...) makes every notebook's first
#: cell slower, so it has to be added to this list on purpose.
LOAD_EXT_TGNB = {
    "tgnb",
    "tgnb.config",
    "tgnb.errors",
    "tgnb.events",
    "tgnb.notebook",
    "tgnb.notebook._wording",
    "tgnb.notebook.commands",
    "tgnb.notebook.commands.grammar",
    "tgnb.notebook.commands.pt",
    "tgnb.notebook.magics",
}

SHELL = "from IPython.core.interactiveshell import InteractiveShell\nshell = InteractiveShell.instance()"


def test_load_ext_imports_only_the_router() -> None:
    """What ``%load_ext tgnb`` adds to a fresh shell's modules: exactly `LOAD_EXT_TGNB` of tgnb,
    no third-party package, and ``%tg --help`` imports no subcommand either."""
    import sys

    shell = modules_after(SHELL)
    loaded = modules_after(f'{SHELL}\nshell.run_line_magic("load_ext", "tgnb")')
    added = loaded - shell
    assert {m for m in added if m.split(".")[0] == "tgnb"} == LOAD_EXT_TGNB
    third_party = {
        m.split(".")[0]
        for m in added
        if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "tgnb"
    }
    assert third_party == set(), f"%load_ext tgnb imports {sorted(third_party)}"
    helped = modules_after(
        f'{SHELL}\nshell.run_line_magic("load_ext", "tgnb")\nshell.run_line_magic("tg", "--help")'
        '\nshell.run_line_magic("tg", "pt --help")'
    )
    assert {m for m in helped - shell if m.startswith("tgnb")} == LOAD_EXT_TGNB


def test_a_subcommand_is_imported_on_first_use() -> None:
    """``%tg launch --help`` imports the launch command (and what it needs), not the others."""
    loaded = modules_after(
        f'{SHELL}\nshell.run_line_magic("load_ext", "tgnb")\nshell.run_line_magic("tg", "launch --help")'
    )
    commands = {m for m in loaded if m.startswith("tgnb.notebook.commands.")}
    assert commands == {
        "tgnb.notebook.commands.grammar",
        "tgnb.notebook.commands.pt",
        "tgnb.notebook.commands.launch",
    }
