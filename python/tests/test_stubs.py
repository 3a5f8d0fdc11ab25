"""The hand-kept stubs of tessera._tessera name what the module has, and the package is typed."""

import ast
from pathlib import Path

import tessera
from tessera import _tessera


def test_stub_names_match_the_module():
    stub = Path(tessera.__file__).with_name("_tessera.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    present = {n for n in dir(_tessera) if not n.startswith("__")}
    assert declared == present
    assert Path(tessera.__file__).with_name("py.typed").is_file()


def test_public_functions_are_documented_and_annotated():
    for name in tessera.__all__:
        obj = getattr(tessera, name)
        if callable(obj) and not isinstance(obj, type):
            assert obj.__doc__ and obj.__annotations__, name
