"""How ``--seeds`` gives a run its seed: the option the script declares, or none.

One reading for ``scalebox run --seeds``, Ray runs and ``scalebox explore`` trials: a script
takes the seed as ``--seed N`` where it declares ``"--seed"`` (argparse, click) or a ``seed: int``
field (tyro / simple-parsing, CleanRL's Args), as ``-seed N`` where argparse declares
``"-seed"`` (BY571's IQN: ``-env``, ``-frames``, ``-seed``), and not at all where every
declaration is a switch (``type=bool``, ``action="store_true"``, click's ``is_flag``: sweetice's
DDPG has ``add_argument('--seed', default=False, type=bool)``, so ``--seed 0`` and ``--seed 1``
were both True). Without one, the launcher seeds random, numpy and torch itself ("env").

The option goes after the run's arguments, except where it belongs to an argparse parser with
subcommands (``parser.add_argument("--seed")`` beside ``parser.add_subparsers()``, or on a
parser it inherits through ``parents=[common]``) or to a click group: they take such an option only before the subcommand (``train.py --seed 0 train --lr 1``;
appended, it was "unrecognized arguments" and every seeded run failed), so there it goes first
(:func:`seed_first`).
"""
from __future__ import annotations

import ast
import functools
import re
from typing import Dict, List, Optional, Sequence, Set, Tuple

_SEED_OPTION = re.compile(r"""["']--seed["']|\bseed\s*:\s*int\b""")
_SWITCH_ACTIONS = ("store_true", "store_false", "store_const", "count")


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> Optional[ast.Module]:
    """The script's tree, parsed once for every question asked of it (a run with --seeds asks
    several, a Ray run once per seed); None where the text does not parse."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _declarations(text: str, flag: str) -> Optional[List[ast.Call]]:
    """The calls that name ``flag`` as a literal argument; None where the text does not parse."""
    tree = _parsed(text)
    if tree is None:
        return None
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)
            and any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)]


def _switch(call: ast.Call) -> Optional[str]:
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    kind, action, flag = kw.get("type"), kw.get("action"), kw.get("is_flag")
    if isinstance(kind, ast.Name) and kind.id == "bool":
        return "type=bool"
    if isinstance(action, ast.Constant) and action.value in _SWITCH_ACTIONS:
        return f"action={action.value!r}"
    if isinstance(flag, ast.Constant) and flag.value is True:
        return "is_flag=True"
    return None


def seed_switch(text: str) -> Optional[str]:
    """How the script declares ``--seed`` where every declaration of it is a switch, not a value
    (``"type=bool"``, ...), else None."""
    calls = _declarations(text, "--seed") or []
    kinds = [_switch(c) for c in calls]
    return kinds[0] if kinds and all(kinds) else None


def seed_flag(source: Optional[bytes]) -> Optional[str]:
    """The option the script takes a seed by: ``"--seed"``, ``"-seed"``, or None (the launcher
    seeds it: "env")."""
    if not source:
        return None
    text = source.decode("utf-8", "replace")
    declared = _declares_seed_option(text)
    if declared is None:  # not Python we can parse: the words
        declared = bool(_SEED_OPTION.search(text))
    if declared:
        return None if seed_switch(text) else "--seed"
    if "-seed" in text:
        calls = _declarations(text, "-seed") or []
        if calls and not any(_switch(c) for c in calls):
            return "-seed"
    return None


#: calls that read a function's parameters as the command line (typer.run(main), tyro.cli(main),
#: fire.Fire(main)) and decorators that do (typer's @app.command(), click's @click.command())
_CLI_CALLS = frozenset({"run", "cli", "Fire"})


def _declares_seed_option(text: str) -> Optional[bool]:
    """Whether the script declares ``--seed`` as code, not as words: the literal ``"--seed"`` as an
    argument of a call (argparse's add_argument, click.option, typer.Option) or compared (a
    sys.argv read by hand), a ``seed: int``
    field of a class (tyro / simple-parsing, CleanRL's Args), or a ``seed: int`` parameter of a
    function given to typer / tyro / fire or decorated as a command. A ``"--seed"`` in a comment
    or a subprocess's argument list, or the ``seed: int`` of a helper (``def make_env(env_id,
    seed: int)``), declares nothing: the script was given ``--seed N`` it refused (argparse:
    unrecognized arguments, every run failed; BY571's ``-seed`` too) or ignored unseeded. None
    where the text does not parse."""
    tree = _parsed(text)
    if tree is None:
        return None
    if _declarations(text, "--seed"):
        return True
    commands: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in _CLI_CALLS:
                commands.update(a.id for a in node.args if isinstance(a, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(  # sys.argv read by hand: a == "--seed", "--seed" in sys.argv
                isinstance(e, ast.Constant) and e.value == "--seed" for e in [node.left, *node.comparators]):
            return True
        if isinstance(node, ast.ClassDef):
            if any(isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name) and f.target.id == "seed"
                   and _is_int(f.annotation) for f in node.body):
                return True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in commands or any("command" in ast.unparse(d) for d in node.decorator_list):
                params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(a.arg == "seed" and a.annotation is not None and _is_int(a.annotation) for a in params):
                    return True
    return False


def _is_int(annotation: ast.expr) -> bool:
    """``int``, ``int | None``: an annotation that starts with int (as the words read before)."""
    return bool(re.match(r"int\b", ast.unparse(annotation)))


def seed_args(flag: str, seed: int) -> List[str]:
    """The seed option ``--seeds`` gives a run (:func:`with_seed` places it, :func:`without_seed`
    takes it off again)."""
    return [flag, str(seed)]


def seed_first(source: Optional[bytes], flag: str) -> bool:
    """Whether ``flag`` belongs ahead of the subcommand: every parser that takes it is an argparse
    parser with subcommands, or it is an option of a click group (``@click.group()`` above
    ``@click.option("--seed")``: click takes it only before the command, as argparse does). Where
    a subcommand's parser takes it too, the option goes after: argparse copies the subcommand's
    default over the top parser's value (``--seed 3 train`` read seed=None, and every seed ran
    unseeded), and click reads the command's own. A parser takes what it declares and what its
    ``parents=[...]`` (parsers of the same file) declare: a ``--seed`` on a ``common`` parser that
    the main parser, with subcommands, inherits was appended after the subcommand ("unrecognized
    arguments", every seeded run failed)."""
    text = source.decode("utf-8", "replace") if source else ""
    tree = _parsed(text) if "add_subparsers" in text or "group" in text else None
    if tree is None:
        return False
    calls = _declarations(text, flag) or []
    with_subcommands = {ast.unparse(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
                        and isinstance(n.func, ast.Attribute) and n.func.attr == "add_subparsers"}
    heirs = _heirs(tree)
    ahead = {id(c) for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "add_argument"
             and _takers(ast.unparse(c.func.value), heirs) <= with_subcommands}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(map(_is_group, node.decorator_list)):
            ahead.update(id(d) for d in node.decorator_list if isinstance(d, ast.Call))
    return bool(calls) and all(id(c) in ahead for c in calls)


_PARSER_CALLS = ("ArgumentParser", "add_parser")


def _heirs(tree: ast.Module) -> Dict[str, Set[str]]:
    """``{parser: the parsers made with it among their parents=[...]}``, by the names the file
    gives them (a parser made without a name, ``sub.add_parser("eval", parents=[common])``, has
    one of its own that nothing else reads). Only argparse's constructors count: ``parents=`` of
    any other call inherits nothing."""
    named = {id(n.value): ast.unparse(n.targets[0]) for n in ast.walk(tree)
             if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call)}
    out: Dict[str, Set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "") not in _PARSER_CALLS:
            continue
        for kw in node.keywords:
            if kw.arg == "parents" and isinstance(kw.value, (ast.List, ast.Tuple)):
                for parent in kw.value.elts:
                    out.setdefault(ast.unparse(parent), set()).add(named.get(id(node), f"<parser {id(node)}>"))
    return out


def _takers(parser: str, heirs: Dict[str, Set[str]]) -> Set[str]:
    """The parsers that take what ``parser`` declares: itself, or, where it is a parent of others
    (a template, ``add_help=False``), every parser that inherits from it, through parents of parents."""
    out: Set[str] = set()
    todo, seen = [parser], {parser}
    while todo:
        name = todo.pop()
        if name not in heirs:
            out.add(name)
            continue
        for heir in heirs[name] - seen:
            seen.add(heir)
            todo.append(heir)
    return out


def _is_group(decorator: ast.expr) -> bool:
    """``@click.group()``, ``@cli.group(...)``, ``@click.group``: a command with subcommands."""
    func = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else "") == "group"


def with_seed(args: Sequence[str], flag: str, seed: int, first: bool = False) -> List[str]:
    """``args`` with the seed option: appended, or ahead of them where ``first`` (:func:`seed_first`)."""
    return [*seed_args(flag, seed), *args] if first else [*args, *seed_args(flag, seed)]


def seeded(source: Optional[bytes], args: Sequence[str], seed: Optional[int]) -> Tuple[List[str], Optional[str]]:
    """A run's arguments with its seed and how it takes it (``seed_via``): the script's option
    appended ("option"), else the launcher seeds it ("env"); ``args`` as they are and None
    without a seed. One reading for ``scalebox explore``'s local and Ray trials."""
    if seed is None:
        return list(args), None
    flag = seed_flag(source)
    return (with_seed(args, flag, seed, seed_first(source, flag)), "option") if flag else (list(args), "env")


def without_seed(args: List[str], seed: Optional[int]) -> List[str]:
    """``args`` without the seed option ``--seeds`` gave them (their last two items, or their first
    two where it went ahead of a subcommand)."""
    if seed is None or len(args) < 2:
        return args
    if args[-2] in ("--seed", "-seed") and args[-1] == str(seed):
        return args[:-2]
    if args[0] in ("--seed", "-seed") and args[1] == str(seed):
        return args[2:]
    return args
