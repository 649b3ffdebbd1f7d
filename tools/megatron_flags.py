#!/usr/bin/env python3
"""Lists every command-line flag of a Megatron-LM checkout's training scripts.

Megatron-LM declares its flags in megatron/training/arguments.py: plain
`add_argument` calls, and groups that `ArgumentGroupFactory` builds from the
fields of config dataclasses (TransformerConfig, TrainingConfig, ...), where a
field becomes `--field-name`, a bool field that defaults to anything but False
becomes `--no-field-name` and `--disable-field-name`, and a field's
metadata["argparse_meta"] may rename it. This script reads those sources with
Python's ast (nothing is imported, so neither torch nor Megatron is needed) and
prints one line per spelling:

    --flag ARITY [post-training]

ARITY is what follows the flag on a command line: `switch` (nothing), `value`
(one word), `values` (one or more words, nargs '+', '*' or a count above 1) or
`optional` (nargs '?'). `argparse.BooleanOptionalAction` adds `--no-FLAG`.
Flags that only the post-training (ModelOpt) scripts add, from
megatron/post_training/arguments.py, are marked `post-training`.

usage: megatron_flags.py CHECKOUT [--ref REF]
  CHECKOUT  a Megatron-LM clone (a work tree, or a git directory with --ref)
  --ref REF read the files at REF (a tag such as core_v0.16.1) through git

mt keeps the output for the Megatron-Core release it follows in
test/spec/Inputs/ (with a header naming the tag and this command); a test
checks that mtc import-megatron's flag table gives each flag one status.
"""
import argparse
import ast
import os
import subprocess
import sys

ARGUMENTS = "megatron/training/arguments.py"
POST_TRAINING = "megatron/post_training/arguments.py"


class Source:
    """Files of the checkout, from the work tree or from a git revision."""

    def __init__(self, root, ref):
        self.root, self.ref = root, ref
        self.cache = {}

    def read(self, path):
        if path not in self.cache:
            if self.ref:
                r = subprocess.run(["git", "-C", self.root, "show", f"{self.ref}:{path}"],
                                   capture_output=True, text=True)
                self.cache[path] = r.stdout if r.returncode == 0 else None
            else:
                full = os.path.join(self.root, path)
                self.cache[path] = open(full).read() if os.path.isfile(full) else None
        return self.cache[path]

    def module(self, dotted):
        """(path, ast) of a dotted module name: a .py file or a package."""
        base = dotted.replace(".", "/")
        for path in (base + ".py", base + "/__init__.py"):
            text = self.read(path)
            if text is not None:
                return path, ast.parse(text, path)
        raise SystemExit(f"megatron_flags.py: cannot find module {dotted} "
                         f"({base}.py or {base}/__init__.py)")


def fail(where, node, what):
    raise SystemExit(f"megatron_flags.py: {where}:{node.lineno}: {what}; "
                     "this script needs to learn the new form")


def module_of(path):
    name = path[:-3].replace("/", ".")
    return name[:-len(".__init__")] if name.endswith(".__init__") else name


def resolve_from(path, node):
    """The absolute module an `from X import ...` in file `path` names."""
    if node.level == 0:
        return node.module
    pkg = module_of(path).split(".")
    if not path.endswith("__init__.py"):
        pkg = pkg[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    return ".".join(pkg + ([node.module] if node.module else []))


def find_class(src, path, tree, name, scopes=()):
    """(path, ClassDef) of `name` as seen from module `path`, following imports
    (also those inside the given function scopes)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return path, node
    for scope in list(scopes) + [tree]:
        for node in ast.walk(scope):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        mpath, mtree = src.module(resolve_from(path, node))
                        return find_class(src, mpath, mtree, alias.name)
    raise SystemExit(f"megatron_flags.py: cannot find class {name} from {path}")


def literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def dashed(name, prefix=None):
    return "--" + ((prefix + "_" + name) if prefix else name).replace("_", "-")


def bool_typed(ann):
    """Whether argparse sees the field as bool, as ArgumentGroupFactory infers
    types: bool, Optional[bool], Union[bool, None], bool | None."""
    if isinstance(ann, ast.Name):
        return ann.id == "bool"
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        return bool_typed(ast.parse(ann.value, mode="eval").body)
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return (isinstance(ann.right, ast.Constant) and ann.right.value is None
                and bool_typed(ann.left))
    if isinstance(ann, ast.Subscript):
        head = ann.value.attr if isinstance(ann.value, ast.Attribute) else \
            getattr(ann.value, "id", "")
        args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
        if head == "Optional":
            return bool_typed(args[0])
        if head == "Union" and len(args) == 2:
            return (isinstance(args[1], ast.Constant) and args[1].value is None
                    and bool_typed(args[0]))
    return False


def list_typed(ann):
    """list[X] (possibly Optional): argparse gets nargs '+'."""
    if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):
        return list_typed(ann.left)
    if isinstance(ann, ast.Subscript):
        head = ann.value.attr if isinstance(ann.value, ast.Attribute) else \
            getattr(ann.value, "id", "")
        if head in ("list", "List"):
            return True
        if head in ("Optional", "Union"):
            args = ann.slice.elts if isinstance(ann.slice, ast.Tuple) else [ann.slice]
            return list_typed(args[0])
    return False


def arity_of(action, nargs):
    if action in ("store_true", "store_false", "store_const", "count", "help", "version"):
        return "switch"
    if nargs in ("+", "*") or (isinstance(nargs, int) and nargs > 1):
        return "values"
    if nargs == "?":
        return "optional"
    if nargs == 0:
        return "switch"
    return "value"


def dataclass_fields(src, path, cls):
    """Fields in dataclass order (bases first; a redefinition keeps its place):
    name -> (annotation, call keywords or None, default node, lineno, path)."""
    fields = {}
    if cls.bases:
        base = cls.bases[0]
        if isinstance(base, ast.Name):
            tree = ast.parse(src.read(path), path)
            bpath, bcls = find_class(src, path, tree, base.id)
            fields.update(dataclass_fields(src, bpath, bcls))
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        ann = ast.unparse(node.annotation)
        if ann.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar")):
            continue
        kw, default = None, node.value
        if (isinstance(node.value, ast.Call) and
                getattr(node.value.func, "id", getattr(node.value.func, "attr", "")) == "field"):
            kw = {k.arg: k.value for k in node.value.keywords}
            default = kw.get("default")
        fields[node.target.id] = (node.annotation, kw, default, node.lineno, path)
    return fields


def factory_flags(src, path, cls, exclude):
    """What ArgumentGroupFactory(cls, exclude).build_group adds."""
    out = []
    for name, (ann, kw, default, line, fpath) in dataclass_fields(src, path, cls).items():
        if name in exclude:
            continue
        if kw is not None and "init" in kw and literal(kw["init"]) is False:
            continue
        meta = {}
        if kw is not None and "metadata" in kw:
            md = kw["metadata"]
            if not isinstance(md, ast.Dict):
                fail(fpath, md, f"metadata of {name} is not a dict literal")
            for k, v in zip(md.keys, md.values):
                if literal(k) == "argparse_meta":
                    if not isinstance(v, ast.Dict):
                        fail(fpath, v, f"argparse_meta of {name} is not a dict literal")
                    meta = {literal(mk): mv for mk, mv in zip(v.keys, v.values)}
        names = [dashed(name)]
        action, nargs = None, None
        if bool_typed(ann):
            # "store_true" if default == False else "store_false"; a missing
            # default (default_factory) compares unequal as well.
            dflt = literal(default) if default is not None else object()
            if default is not None and dflt is None and not (
                    isinstance(default, ast.Constant) and default.value is None):
                fail(fpath, default, f"default of bool field {name} is not a literal")
            action = "store_true" if dflt is False else "store_false"
            if action == "store_false":
                names = [dashed(name, "no"), dashed(name, "disable")]
        elif list_typed(ann):
            nargs = "+"
        if "arg_names" in meta:
            names = literal(meta["arg_names"])
            if not names or not all(isinstance(n, str) for n in names):
                fail(fpath, meta["arg_names"], f"arg_names of {name} is not a list of strings")
        if "action" in meta:
            action = literal(meta["action"])
        if "nargs" in meta:
            nargs = literal(meta["nargs"])
        out += [(n, arity_of(action, nargs)) for n in names]
    return out


def add_argument_flags(where, call):
    names = []
    for a in call.args:
        if not (isinstance(a, ast.Constant) and isinstance(a.value, str)):
            fail(where, call, "add_argument with a computed flag name")
        names.append(a.value)
    kw = {k.arg: k.value for k in call.keywords}
    action, nargs = None, None
    if "action" in kw:
        a = kw["action"]
        if isinstance(a, ast.Attribute) and a.attr == "BooleanOptionalAction":
            action = "boolean-optional"
        elif isinstance(a, ast.Constant):
            action = a.value
        else:
            fail(where, a, "add_argument with an action this script does not know")
    if "nargs" in kw:
        nargs = literal(kw["nargs"])
    if action == "boolean-optional":
        flags = []
        for n in names:
            flags.append((n, "switch"))
            if n.startswith("--"):
                flags.append(("--no-" + n[2:], "switch"))
        return flags
    return [(n, arity_of(action, nargs)) for n in names]


def megatron_flags(src):
    text = src.read(ARGUMENTS)
    if text is None:
        raise SystemExit(f"megatron_flags.py: {ARGUMENTS} is not in the checkout")
    tree = ast.parse(text, ARGUMENTS)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    top = funcs.get("add_megatron_arguments")
    if top is None:
        raise SystemExit(f"megatron_flags.py: {ARGUMENTS} has no add_megatron_arguments")
    called = [n.func.id for n in ast.walk(top)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in funcs]
    flags = {}
    for fname in called:
        fn = funcs[fname]
        factories = {}
        # Statement order matters for factories; ast.walk is breadth-first,
        # so collect the assignments first.
        for node in ast.walk(fn):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and
                    getattr(node.value.func, "id", "") == "ArgumentGroupFactory"):
                call = node.value
                cls_name = call.args[0].id
                kw = {k.arg: k.value for k in call.keywords}
                exclude = set()
                if "exclude" in kw:
                    ex = kw["exclude"]
                    if isinstance(ex, ast.Name):  # a list assigned earlier in the function
                        ex = next((a.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                                   and any(getattr(t, "id", "") == ex.id for t in a.targets)),
                                  None)
                    exclude = literal(ex) if ex is not None else None
                    if not isinstance(exclude, list):
                        fail(ARGUMENTS, call, "an exclude list that is not a literal")
                    exclude = set(exclude)
                cpath, cls = find_class(src, ARGUMENTS, tree, cls_name, scopes=[fn])
                for t in node.targets:
                    factories[t.id] = (cpath, cls, exclude)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            new = []
            if node.func.attr == "add_argument":
                new = add_argument_flags(ARGUMENTS, node)
            elif node.func.attr == "build_group" and isinstance(node.func.value, ast.Name):
                if node.func.value.id not in factories:
                    fail(ARGUMENTS, node, "build_group on something other than a factory")
                new = factory_flags(src, *factories[node.func.value.id])
            for flag, arity in new:
                # argparse refuses a second declaration, so one here means this
                # script misread something (an exclude list, a rename).
                if flag in flags:
                    raise SystemExit(f"megatron_flags.py: {flag} is declared twice "
                                     f"(in {fname})")
                flags[flag] = arity
    # add_argument outside what add_megatron_arguments runs would be missed.
    for name, fn in funcs.items():
        if name in called or name == "add_megatron_arguments":
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                fail(ARGUMENTS, node, f"add_argument in {name}, which "
                     "add_megatron_arguments does not call")
    return flags


def post_training_flags(src):
    """Every add_argument of the post-training scripts' argument file."""
    text = src.read(POST_TRAINING)
    if text is None:
        return {}
    flags = {}
    for node in ast.walk(ast.parse(text, POST_TRAINING)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for flag, arity in add_argument_flags(POST_TRAINING, node):
                flags[flag] = arity
    return flags


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("checkout")
    p.add_argument("--ref")
    args = p.parse_args()
    src = Source(args.checkout, args.ref)
    flags = {f: (a, "") for f, a in megatron_flags(src).items()}
    for flag, arity in post_training_flags(src).items():
        flags.setdefault(flag, (arity, " post-training"))
    for flag in sorted(flags):
        print(f"{flag} {flags[flag][0]}{flags[flag][1]}")


if __name__ == "__main__":
    main()
