# SPDX-License-Identifier: Apache-2.0
"""The user docs agree with the code (issue 63): every `vllm-dflash ...` command quoted in README.md and docs/*.md
parses with the real argparse parsers (vllm_dflash/cli.py, and the soak's own for `vllm-dflash soak`), and every
relative link in them resolves to a file, and to a heading when it names an anchor.

A quoted command is a line of a fenced code block that runs `vllm-dflash` (it must be complete: runnable as it
stands), or an inline code span (it may leave out required options when it refers to one flag, as in
`vllm-dflash collect --ray N`; every flag it names must exist and take its value). Conventions the docs use: an
upper-case word or `<...>` is a placeholder (`--ray N`, `--out DIR`: any value; `SUBCOMMAND`: every subcommand),
`...` elides further flags, and `vllm-dflash` alone (or `vllm-dflash ...`) names the program, not a command."""
import argparse
import contextlib
import functools
import io
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*")
FENCE = re.compile(r"^\s*(```|~~~)")
COMMAND = re.compile(r"(?:^|(?<=[\s;&|(]))(?:\S*/)?vllm-dflash(?=\s|$)(.*)")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _split_code(text: str) -> tuple[list[str], list[str]]:
    """(lines inside fenced code blocks, with `\\` continuations joined; the prose lines outside them)."""
    code, prose, in_fence, pending = [], [], False, ""
    for line in text.splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            prose.append(line)
        elif line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
        else:
            code.append(pending + line)
            pending = ""
    return code, prose


def _command_args(rest: str) -> list[str] | None:
    """The arguments after `vllm-dflash` up to the end of the shell command (a comment, `&&`, `|`, `;`), or None
    where the quote names the program only."""
    rest = re.sub(r"<[^<>]*>", "X", re.split(r"\s#|&&|\|\||[|;]", rest)[0])
    args = [a for a in shlex.split(rest) if a != "..."]
    return args or None


def quoted_commands() -> list[tuple[str, list[str], bool]]:
    """(where, argv after `vllm-dflash`, complete: from a code block) for every command quoted in the user docs."""
    out = []
    for path in DOCS:
        code, prose = _split_code(path.read_text())
        spans = [span for line in prose for span in re.findall(r"`([^`]+)`", line)]
        for complete, texts in ((True, code), (False, spans)):
            for text in texts:
                m = COMMAND.search(text)
                if m and (args := _command_args(m.group(1))) is not None:
                    out.append((f"{path.relative_to(ROOT)}: {text.strip()[:100]}", args, complete))
    return out


def _parser_for(args: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    """The parser that reads `vllm-dflash ARGS` (the soak has its own, cli.main hands it everything after `soak`)."""
    from vllm_dflash.cli import build_parser

    if args[:1] == ["soak"]:
        from vllm_dflash.bench.soak.run import build_parser as soak_parser

        return soak_parser(prog="vllm-dflash soak"), args[1:]
    return build_parser(), args


def _options_optional(parser: argparse.ArgumentParser) -> None:
    """Every option of the parser and of its subcommands' parsers made optional (the subcommand itself stays
    required)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _options_optional(sub)
        else:
            action.required = False


def parse(args: list[str], complete: bool = True) -> None:
    """Parse like `vllm-dflash ARGS` without running anything; --help counts as parsed; complete False: required
    options may be missing. Raises SystemExit(2) with argparse's message on stderr where the parser refuses it."""
    parser, argv = _parser_for(args)
    if not complete:
        _options_optional(parser)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            if e.code not in (0, None):
                raise


def _expand(args: list[str]) -> list[list[str]]:
    """Placeholders filled in: `SUBCOMMAND` as every subcommand, any other upper-case word as a value (`1`, which
    every option that takes a value here accepts)."""
    from vllm_dflash.cli import build_parser

    if args and PLACEHOLDER.fullmatch(args[0]):
        sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
        heads = [[name] for name in sub.choices]
    else:
        heads = [args[:1]]
    tail = ["1" if PLACEHOLDER.fullmatch(a) else a for a in args[1:]]
    return [head + tail for head in heads]


COMMANDS = quoted_commands()


def test_the_docs_quote_commands():
    """The scan finds what it should: the README's install line, and the per-subcommand --help."""
    found = {" ".join(args) for _, args, _ in COMMANDS}
    assert "demo" in found and "SUBCOMMAND --help" in found, sorted(found)
    assert len(COMMANDS) >= 10


@pytest.mark.parametrize("where,args,complete", COMMANDS, ids=[w for w, _, _ in COMMANDS])
def test_quoted_command_parses(where, args, complete, capsys):
    for argv in _expand(args):
        try:
            parse(argv, complete)
        except SystemExit:
            pytest.fail(f"{where}: `vllm-dflash {' '.join(argv)}` does not parse: {capsys.readouterr().err.strip()}")


def test_the_parser_refuses_what_does_not_exist():
    """The check has teeth: a subcommand or a flag that does not exist is refused (the review found
    `vllm-dflash prepare` in the docs)."""
    refused = (["prepare"], ["bench", "--no-such-flag"], ["soak", "--no-such-flag"], ["eval", "--ngram"],
               ["collect", "--ray", "N"])
    for bad, complete in [(b, c) for b in refused for c in (True, False)] + [(["collect", "--ray", "2"], True)]:
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            parse(bad, complete)
    parse(["collect", "--ray", "2"], complete=False)  # a quote of one flag: --out left out


def test_every_help_shows_its_defaults():
    """README: `vllm-dflash SUBCOMMAND --help` lists every flag with its default; the soak too, under its own name."""
    from vllm_dflash.bench.soak.run import build_parser as soak_parser
    from vllm_dflash.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parsers = {f"vllm-dflash {name}": p for name, p in sub.choices.items() if name != "soak"}
    parsers["vllm-dflash soak"] = soak_parser(prog="vllm-dflash soak")
    for name, parser in parsers.items():
        fmt = parser._get_formatter()
        shown = [a for a in parser._actions
                 if a.option_strings and not a.required and a.help != argparse.SUPPRESS and a.dest != "help"]
        quiet = [a.option_strings[0] for a in shown if "default" not in (fmt._get_help_string(a) or "")]
        assert not quiet, f"{name} --help shows no default for {quiet}"
    assert parsers["vllm-dflash soak"].format_usage().startswith("usage: vllm-dflash soak ")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markdown marks and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (repeats numbered as GitHub does) and explicit `<a id/name>`."""
    seen: dict[str, int] = {}
    out = set()
    code_free = "\n".join(_split_code(path.read_text())[1])
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", code_free, re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    out |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", code_free))
    return out


def relative_links() -> list[tuple[str, Path, str]]:
    """(where, the file a link points to, its anchor or '') for every relative link of the user docs."""
    out = []
    for path in DOCS:
        for line in _split_code(path.read_text())[1]:
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                out.append((f"{path.relative_to(ROOT)} -> {target}", (path.parent / file).resolve() if file else path,
                            anchor))
    return out


LINKS = relative_links()


def test_the_docs_have_links():
    assert len(LINKS) >= 20


@pytest.mark.parametrize("where,target,anchor", LINKS, ids=[w for w, _, _ in LINKS])
def test_relative_link_resolves(where, target, anchor):
    assert target.exists(), f"{where}: {target} does not exist"
    if anchor and target.suffix == ".md":
        assert anchor in anchors(target), f"{where}: no heading with anchor #{anchor} in {target.name}"
