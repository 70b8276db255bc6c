"""Reading a config file: YAML with bounds, so that no file makes the reader slow, deep or unreadable.

Provides:
    read_yaml(path) -> Any      the document of a config file; ConfigError (one line, naming the file, the
                                key where known, and the fix) for a path that is not a regular file (a
                                directory, a FIFO, a device: refused before it is opened), a file that is
                                unreadable, too large, binary, not UTF-8, not YAML, nested deeper than
                                MAX_DEPTH, larger than MAX_NODES once aliases are expanded, or with a
                                duplicate key. An empty file reads as None (TierCacheConfig refuses it)
    MAX_FILE_BYTES (64 KiB), MAX_DEPTH (8), MAX_NODES (256)

A tiercache config is a few hundred bytes, three levels deep, about 20 values. The bounds are checked while
the document is composed, before anything recurses further or expands: depth as each node opens, the size of
each node with aliases counted as often as they are used (a YAML "billion laughs" fails at its first level
over MAX_NODES). Integers of more than 40 digits are kept as text, so the key's own check reports them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.nodes import MappingNode, ScalarNode, SequenceNode

from tiercache.errors import ConfigError, clipped, shown
from tiercache.files import NotRegularFile, read_regular

MAX_FILE_BYTES = 64 << 10
MAX_DEPTH = 8
MAX_NODES = 256
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TOP = "(top level)"


def read_yaml(path: Path) -> Any:
    name = clipped(str(path))  # the file as messages name it (a 4 KB path too)
    text = _read_text(path, name)
    loader = None
    try:
        loader = _BoundedLoader(text, name)  # the reader checks the characters here already
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        text = " ".join(str(exc).replace('"<unicode string>", ', "").split())  # one line, bounded
        text = text if len(text) <= 300 else text[:299] + "…"
        raise ConfigError(f"{name}: not valid YAML: {text}") from None
    except RecursionError:  # a safety net: the bounds above stop every nesting we know of first
        raise ConfigError(f"{name}: nested too deeply to read; a tiercache config is 3 levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()


def _read_text(path: Path, name: str) -> str:
    if "\0" in str(path):
        raise ConfigError(f"cannot read config file {name}: a path has no NUL character; check the path")
    try:
        data = read_regular(path, MAX_FILE_BYTES)
    except NotRegularFile as exc:
        raise ConfigError(
            f"config file {name} is {exc.kind}, not a regular file; give the path of a tiers YAML file "
            "(examples/tiers.yaml shows the format)"
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {name}: {exc.strerror or exc}; check the path, and that this process "
            "may read the file"
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(
            f"{name}: larger than {MAX_FILE_BYTES // 1024} KiB; a tiercache config is a few hundred bytes "
            "(examples/tiers.yaml): is this the right file?"
        )
    nul = data.find(b"\0")
    if nul >= 0:
        raise ConfigError(
            f"{name}: a binary file (a NUL byte at offset {nul}), not a YAML config; "
            "check the path (examples/tiers.yaml shows the format)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{name}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); save it as UTF-8"
        ) from None


class _BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, source: str) -> None:
        super().__init__(stream)
        self._source = source
        self._depth = 0  # collections open around the node being composed (complex keys too)
        self._keys: list[str] = []  # the key path of the node being composed, for messages
        self._size: dict[int, int] = {}  # id(node) → nodes in it, aliases expanded
        self._where: dict[int, str] = {}  # id(mapping node) → its key path, for messages

    def compose_node(self, parent, index):
        key = _key_name(index)
        if key is not None:
            self._keys.append(key)
        if self.check_event(yaml.AliasEvent):
            anchored = self.anchors.get(self.peek_event().anchor)
            if anchored is not None and id(anchored) not in self._size:  # still open: it contains itself
                raise ConfigError(f"{self._path()}: a recursive alias ({self._source}); write the value out")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH and not self.check_event(yaml.AliasEvent, yaml.ScalarEvent):
                mark = self.peek_event().start_mark
                raise ConfigError(
                    f"{self._path()}: nested deeper than {MAX_DEPTH} levels ({self._source}, line "
                    f"{mark.line + 1}); a tiercache config is 3 levels deep (codec: {{keys: 8}}): see "
                    "examples/tiers.yaml"
                )
            node = super().compose_node(parent, index)
            self._count(node)
        finally:
            self._depth -= 1
            if key is not None:
                self._keys.pop()
        return node

    def _count(self, node) -> None:
        if id(node) in self._size:
            return  # an alias: its size is known, and its parent adds it once per use
        if isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
            self._where[id(node)] = self._path()
        else:
            children = node.value if isinstance(node, SequenceNode) else []
        size = 1 + sum(self._size[id(child)] for child in children)
        if size > MAX_NODES:
            raise ConfigError(
                f"{self._path()}: more than {MAX_NODES} values once YAML aliases are expanded "
                f"({self._source}); a tiercache config has about 20: write the values out"
            )
        self._size[id(node)] = size

    def _path(self) -> str:
        path = "".join(k if k.startswith("[") or not i else "." + k for i, k in enumerate(self._keys))
        return path or _TOP

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            seen: dict[str, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                    continue
                line = key_node.start_mark.line + 1
                if key_node.value in seen:
                    where = self._where.get(id(node), _TOP)
                    name = (where + "." if where != _TOP else "") + key_node.value
                    raise ConfigError(
                        f"{shown(name, 80)}: duplicate key, on lines {seen[key_node.value]} and {line} "
                        f"({self._source}); keep one (YAML would silently use the last)"
                    )
                seen[key_node.value] = line
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        if len(node.value) > 40:
            return node.value  # as text: the key's check says it is out of range, naming the key
        return super().construct_yaml_int(node)


def _key_name(index) -> str | None:
    """How the key path names a child: a mapping key (shortened), a sequence index, None for a key node."""
    if isinstance(index, int):
        return f"[{index}]"
    if not isinstance(index, ScalarNode):
        return None
    return index.value if len(index.value) <= 40 else shown(index.value, 40)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)
