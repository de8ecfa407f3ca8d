"""The one reader of YAML that users write: spec, sweep, suite and pipeline files and `--set` values.
A file can be mistaken or hostile, so whatever it holds ends in a document or one SpecError naming
the file: its size, encoding, nesting and alias expansion are bounded, and a key given twice in one
mapping is refused (plain YAML keeps the last one silently)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from aa_ray.errors import SpecError, clip

MAX_FILE_BYTES = 1 << 20  # the largest shipped spec is under 2 KB
MAX_DEPTH = 64  # sections in sections; a spec needs a handful, env.kwargs a few more
# Aliases let a few hundred bytes stand for millions of values ("billion laughs"); every consumer of
# the document (deepcopy, validation, hashing, error messages) would expand them.
MAX_VALUES = 100_000

_MERGE_TAG = "tag:yaml.org,2002:merge"


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (merge keys `<<` may still
    be overridden, which is what they are for)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, Node] = {}  # key -> the node that gave it first
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key: the safe loader refuses it itself, below
                continue
            if earlier is not key_node:
                raise SpecError(
                    f"{self.name}: key {clip(repr(key))} is given twice in one mapping (line "
                    f"{earlier.start_mark.line + 1} and line {key_node.start_mark.line + 1}); YAML would keep only "
                    "the last, so give it once."
                )
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """The document in `text`, or SpecError naming `source` (a file, or a `--set` override)."""
    stream = io.StringIO(text)
    stream.name = source  # PyYAML's error marks say where: in "<source>", line 3, column 5
    try:
        loader = _SpecLoader(stream)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise SpecError(f"{source}: not valid YAML ({clip(str(err), 1000)}).") from None
    except RecursionError:
        raise SpecError(f"{source}: nested too deeply to read (a spec nests at most {MAX_DEPTH} levels).") from None


def _check_size(root: Node, source: str) -> None:
    """SpecError unless the document, with every alias expanded, nests at most MAX_DEPTH levels and
    holds at most MAX_VALUES values. An alias that contains itself nests without end and is refused
    the same way."""
    expanded: dict[int, int] = {}  # node id -> values under it, aliases expanded (each node counted once)

    def size(node: Node, depth: int) -> int:
        if depth > MAX_DEPTH:
            raise SpecError(
                f"{source}: nested more than {MAX_DEPTH} levels deep (or an alias (*name) refers to the mapping or "
                "list that contains it); a spec needs a few levels of sections."
            )
        if id(node) not in expanded:
            if isinstance(node, SequenceNode):
                children = node.value
            elif isinstance(node, MappingNode):
                children = [child for pair in node.value for child in pair]
            else:
                children = []
            expanded[id(node)] = 1 + sum(size(child, depth + 1) for child in children)
            if expanded[id(node)] > MAX_VALUES:
                raise SpecError(
                    f"{source}: holds more than {MAX_VALUES:,} values once its aliases (*name) are expanded; a spec "
                    "holds a few hundred. Check the anchors (&name) and aliases: each alias repeats its anchor's "
                    "whole value."
                )
        return expanded[id(node)]

    size(root, 0)


def read_yaml_file(path: Path) -> Any:
    """The document in the file at `path`, or SpecError saying in one paragraph why it cannot be read."""
    if path.is_dir():
        raise SpecError(f"{path} is a folder, not a spec file; pass the path of a YAML file in it.")
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist; pass a path to a YAML spec.")
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        raise SpecError(f"{path}: cannot be read ({err.strerror or err}).") from None
    if len(data) > MAX_FILE_BYTES:
        raise SpecError(f"{path}: larger than {MAX_FILE_BYTES >> 20} MiB, which no spec is; is it the right file?")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(
            f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save it as UTF-8."
        ) from None
    return parse_yaml(text, str(path))
