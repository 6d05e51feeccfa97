"""The one YAML loader: PyYAML's safe loader with the document limits of ``_limits``.

YAML reaches the tool as engine option files (``--base-options``, ``export trtllm --base-options``)
and as the exported ``extra_llm_api_options.yaml`` it checks again. PyYAML's ``safe_load`` builds
only plain types, but bounds nothing: nesting 2,000 deep ends in a bare ``RecursionError``, a
5,000-digit integer in a bare ``ValueError``, a megabyte-long list costs seconds and hundreds of
megabytes, and a few lines of aliases expand to millions of nodes for whoever walks the result.
:func:`load_yaml` composes the document node by node and refuses, as the document's own
:class:`YamlError`, nesting deeper than :data:`MAX_DOCUMENT_DEPTH`, more than
:data:`MAX_YAML_NODES` nodes (an alias counted as the whole subtree it stands for, as often as it
is used), integers longer than :data:`MAX_INT_DIGITS` digits and a mapping that repeats a key.
Byte limits are the caller's (each file kind has its own, in ``_limits``). Performs no I/O.
"""

from __future__ import annotations

from typing import Any

import yaml

from dspark_calibrate.artifacts._limits import MAX_DOCUMENT_DEPTH, MAX_INT_DIGITS, MAX_YAML_NODES
from dspark_calibrate.errors import InvalidValueError

__all__ = ["YamlError", "load_yaml"]

# Characters an integer literal may carry besides digits (sign, YAML 1.1 prefixes, separators and
# sexagesimal colons): the limit counts all of them, so ``1_0_0...`` or ``1:2:3...`` are bounded too.
_INT_SLACK = 4


class YamlError(InvalidValueError):
    """YAML that is not acceptable: syntax, a repeated key, or beyond a document limit."""

    default_code = "YAML_INVALID"


class _Limit(yaml.YAMLError):  # type: ignore[misc]  # PyYAML ships no type hints
    """A document limit, raised from inside the composer (reported as :class:`YamlError`)."""


class _Bounds:
    """Mixed into a safe loader: counts nodes and depth as it composes, bounds integer literals and
    refuses repeated keys.

    Per node it keeps the size and height of the subtree it roots, so that an alias (which
    PyYAML resolves to the node it names, shared) is charged for everything it stands for.
    """

    # Provided by the loader classes this is mixed into (PyYAML's Composer and Constructor).
    check_event: Any
    peek_event: Any
    construct_object: Any
    construct_mapping: Any
    construct_yaml_int: Any

    def _start_counting(self) -> None:
        self._depth = 0
        self._nodes = 0
        self._size: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, height) of its subtree

    def compose_node(self, parent: Any, index: Any) -> Any:
        alias = self.check_event(yaml.AliasEvent)
        mark = self.peek_event().start_mark
        self._depth += 1  # the top-level node is level 0, as in JSON
        try:
            if self._depth > MAX_DOCUMENT_DEPTH + 1:
                raise _Limit(f"nests deeper than {MAX_DOCUMENT_DEPTH} levels (line {mark.line + 1})")
            node = super().compose_node(parent, index)  # type: ignore[misc]  # the Composer's
        finally:
            self._depth -= 1
        if alias:
            if id(node) not in self._size:  # the alias names a node that encloses it
                raise _Limit(f"holds a recursive alias (line {mark.line + 1})")
            nodes, height = self._size[id(node)]
        else:
            nodes, height = self._subtree(node)
            self._size[id(node)] = (nodes, height)
        self._nodes += nodes if alias else 1
        if self._nodes > MAX_YAML_NODES:
            raise _Limit(f"holds more than {MAX_YAML_NODES} nodes, aliases expanded (line {mark.line + 1})")
        if self._depth + height > MAX_DOCUMENT_DEPTH + 1:
            raise _Limit(
                f"nests deeper than {MAX_DOCUMENT_DEPTH} levels through an alias (line {mark.line + 1})"
            )
        return node

    def _subtree(self, node: Any) -> tuple[int, int]:
        """``(nodes, height)`` of a freshly composed node from its children's (already known)."""
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            return 1, 1
        sizes = [self._size.get(id(c), (1, 1)) for c in children]
        return 1 + sum(n for n, _ in sizes), 1 + max((h for _, h in sizes), default=0)

    def construct_bounded_int(self, node: Any) -> Any:
        text = str(node.value)
        if len(text) > MAX_INT_DIGITS + _INT_SLACK:
            raise _Limit(
                f"an integer literal of {len(text)} characters is longer than the {MAX_INT_DIGITS}-digit "
                f"limit (line {node.start_mark.line + 1})"
            )
        return self.construct_yaml_int(node)

    def construct_unique_mapping(self, node: Any) -> Any:
        # Only keys written out count: a merge (``<<: *base``) may be overridden by design.
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=False)
            try:
                repeated = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: construct_mapping reports it
                break
            if repeated:
                raise _Limit(f"repeats the key {key!r} (line {key_node.start_mark.line + 1})")
        return self.construct_mapping(node)


class _PyLoader(_Bounds, yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints
    """The bounded loader on PyYAML's pure-Python parser."""

    def __init__(self, stream: str) -> None:
        yaml.SafeLoader.__init__(self, stream)
        self._start_counting()


_LOADERS: list[type] = [_PyLoader]

if yaml.__with_libyaml__:  # pragma: no branch - the wheels ship libyaml
    from yaml._yaml import CParser

    class _CLoader(
        _Bounds,
        yaml.composer.Composer,  # type: ignore[misc]  # PyYAML ships no type hints
        yaml.constructor.SafeConstructor,  # type: ignore[misc]
        yaml.resolver.Resolver,  # type: ignore[misc]
        CParser,  # type: ignore[misc]
    ):
        """The bounded loader on libyaml's parser: events come from C (4-5x faster on long
        documents), nodes are still composed here, one at a time, so every limit applies."""

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)
            self._start_counting()

    _LOADERS.insert(0, _CLoader)

for _loader in _LOADERS:
    _loader.add_constructor("tag:yaml.org,2002:int", _Bounds.construct_bounded_int)  # type: ignore[attr-defined]
    _loader.add_constructor("tag:yaml.org,2002:map", _Bounds.construct_unique_mapping)  # type: ignore[attr-defined]


def load_yaml(data: bytes | str, *, what: str = "YAML document") -> Any:
    """Parse one untrusted YAML document with the safe loader, within the document limits.

    Args:
        data: UTF-8 bytes or text (already bounded in size by the caller).
        what: how to name the document in error messages (usually its path).

    Returns:
        The document (plain types only; ``None`` for an empty one).

    Raises:
        YamlError: not UTF-8, not YAML, more than one document, a repeated key, or beyond a limit;
            the message names ``what``.
    """
    try:
        text = data.decode("utf-8") if isinstance(data, bytes | bytearray) else data
    except UnicodeDecodeError as exc:
        raise YamlError(f"{what}: not UTF-8 text ({exc.reason}); save it as UTF-8") from None
    loader = _LOADERS[0](text)
    try:
        return loader.get_single_data()
    except _Limit as exc:
        raise YamlError(f"{what}: {exc}") from None
    except RecursionError:  # pragma: no cover - the depth limit stops composition long before
        raise YamlError(f"{what}: nests too deeply") from None
    except yaml.YAMLError as exc:
        raise YamlError(f"{what}: not valid YAML ({exc})") from None
    except ValueError as exc:  # a conversion the constructor refuses (e.g. a malformed timestamp)
        raise YamlError(f"{what}: not acceptable YAML ({exc})") from None
    finally:
        loader.dispose()
