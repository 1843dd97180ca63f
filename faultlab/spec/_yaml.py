"""YAML text → plain data, plus the line of every key and list item, plus duplicate keys.

PyYAML's composer gives the node tree with marks (lines); the data is then constructed from
that same tree with the safe constructor, so lines and values always agree. PyYAML keeps the
last of two equal keys without a word; the walk over the tree reports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from faultlab.errors import Problem
from faultlab.spec._base import render_path, show

__all__: list[str] = []

Key = tuple[Any, ...]
"""A place in the data: the keys and indices from the root, e.g. ``("faults", 1, "type")``."""

MERGE_TAG = "tag:yaml.org,2002:merge"


@dataclass
class YamlDoc:
    data: Any
    """The constructed document; ``None`` for an empty file or after a problem."""
    lines: dict[Key, int] = field(default_factory=dict)
    """1-based line of every place: a key's line for mapping values, the item's for lists."""
    problems: list[Problem] = field(default_factory=list)
    unreadable_value: bool = False
    """A scalar could not be constructed (so neither can the document)."""

    def line_of(self, key: Key) -> int | None:
        """Line of ``key``, else of its nearest ancestor that has one."""
        for n in range(len(key), -1, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return None


def read_yaml(text: str, file: Path | None) -> YamlDoc:
    """Parse one YAML document; every failure becomes a located ``Problem``."""
    def problem(line: int | None, message: str) -> YamlDoc:
        return YamlDoc(None, problems=[Problem(file, line, "", message)])

    loader: yaml.SafeLoader | None = None
    try:
        loader = yaml.SafeLoader(text)  # checks every character: may raise ReaderError
        node = loader.get_single_node()
        if node is None:
            return YamlDoc(None)
        doc = YamlDoc(None, {(): node.start_mark.line + 1})
        _walk(loader, node, (), doc, file, set())
        if doc.unreadable_value:
            return doc
        doc.data = loader.construct_document(node)
        return doc
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        return problem(mark.line + 1 if mark else None, f"invalid YAML: {what}")
    except yaml.reader.ReaderError as e:
        char = f" (character #x{e.character:04x})" if isinstance(e.character, int) else ""
        return problem(text[: e.position].count("\n") + 1, f"invalid YAML: {e.reason}{char}")
    except yaml.YAMLError as e:
        return problem(None, f"invalid YAML: {e}")
    except RecursionError:
        line = loader.line + 1 if loader is not None else None  # where the parser gave up
        return problem(line, "invalid YAML: nested too deeply")
    except (ValueError, TypeError, OverflowError) as e:  # a constructor choked on a value
        return problem(None, f"invalid YAML value: {e}")
    finally:
        if loader is not None:
            loader.dispose()


def _walk(loader: yaml.SafeLoader, node: yaml.Node, key: Key, doc: YamlDoc,
          file: Path | None, seen: set[int]) -> None:
    # An alias is the same node object again: walk each node once, so that a document of
    # nested aliases ("billion laughs") costs its size, not its expansion.
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        try:
            loader.construct_object(node)
        except (ValueError, TypeError, OverflowError) as e:  # e.g. an int of 5000 digits
            doc.problems.append(Problem(file, node.start_mark.line + 1, render_path(key),
                                        f"invalid value: {e}"))
            doc.unreadable_value = True
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[(*key, i)] = item.start_mark.line + 1
            _walk(loader, item, (*key, i), doc, file, seen)
    elif isinstance(node, yaml.MappingNode):
        first: dict[Any, int] = {}
        for key_node, value_node in node.value:
            if key_node.tag == MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                _walk(loader, value_node, key, doc, file, seen)
                continue
            name = loader.construct_object(key_node)
            line = key_node.start_mark.line + 1
            try:
                hash(name)
            except TypeError:
                continue
            if name in first:
                doc.problems.append(Problem(
                    file, line, render_path((*key, name)),
                    f"duplicate key {show(name)} (first at line {first[name]}); YAML keeps "
                    f"only the last one, so remove one of them"))
            first.setdefault(name, line)
            doc.lines[(*key, name)] = line
            _walk(loader, value_node, (*key, name), doc, file, seen)
