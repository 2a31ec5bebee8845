"""What the config's fields are: their docs and defaults (the configuration reference, ``exgrpo
config``), which a resumed run may change, which are a run's MLflow params, and a config as flat
dotted keys (MLflow params, search spaces, comparing two runs' configs)."""

from __future__ import annotations

import json
import typing
from typing import Any, Literal

from pydantic import BaseModel

from exgrpo.config.experiment import CompareConfig, ExperimentConfig  # noqa: F401 - the defaults' models


def _union_members(annotation: Any) -> list[type[BaseModel]]:
    """The config classes a field may hold: one for a section, several for a union (task, policy, algorithm)."""
    if isinstance(annotation, type):
        return [annotation] if issubclass(annotation, BaseModel) else []
    return [m for a in typing.get_args(annotation) for m in _union_members(a)]


def _tag_field(members: list[type[BaseModel]]) -> str:
    """The discriminator of a union of sections: the field whose type is a Literal in every member."""
    return next(n for n, f in members[0].model_fields.items() if typing.get_origin(f.annotation) is Literal)


def field_docs(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted name, default as JSON or ``required``, docstring) for every leaf field of the config. In a union section
    (task, policy, algorithm) a field that only some members have says which, e.g.
    ``[algorithm.replay=buckets|uniform]``."""
    rows: list[tuple[str, str, str]] = []
    for name, f in model.model_fields.items():
        members = _union_members(f.annotation)
        if not members:
            if f.is_required():
                rows.append((f"{prefix}{name}", "required", f.description or ""))
                continue
            default = f.get_default(call_default_factory=True)
            default = default.value if hasattr(default, "value") else default
            rows.append((f"{prefix}{name}", json.dumps(default, default=str), f.description or ""))
            continue
        if len(members) == 1:
            rows += field_docs(members[0], f"{prefix}{name}.")
            continue
        tag = _tag_field(members)
        first = type(f.get_default(call_default_factory=True))  # the default member's defaults are shown
        members.sort(key=lambda m: m is not first)
        def tag_of(m: type[BaseModel], tag: str = tag) -> str:
            value = m.model_fields[tag].default
            return str(value.value if hasattr(value, "value") else value)

        seen: dict[str, tuple[tuple[str, str, str], list[str]]] = {}
        for m in members:
            for row in field_docs(m, f"{prefix}{name}."):
                seen.setdefault(row[0], (row, []))[1].append(tag_of(m))
        for dotted, (row, tags) in seen.items():
            if dotted == f"{prefix}{name}.{tag}":
                row = (row[0], row[1], f"{f.description} One of: {', '.join(tags)}.")
            elif len(tags) < len(members):
                row = (row[0], row[1], f"{row[2]}  [{prefix}{name}.{tag}={'|'.join(tags)}]")
            rows.append(row)
    return rows


def config_fields() -> list[str]:
    """Every dotted config field (of every union member), e.g. for validating a search space."""
    return sorted(n for n, _, _ in field_docs())


def resume_safe_fields(model: type[BaseModel] = ExperimentConfig, prefix: str = "") -> frozenset[str]:
    """Dotted names of the leaf fields marked ``RESUME_SAFE``, in every union member: the fields a
    resumed run may change (:mod:`exgrpo.runs`)."""
    names: set[str] = set()
    for name, f in model.model_fields.items():
        members = _union_members(f.annotation)
        if not members and (f.json_schema_extra or {}).get("resume_safe"):
            names.add(f"{prefix}{name}")
        for m in members:
            names |= resume_safe_fields(m, f"{prefix}{name}.")
    return frozenset(names)


def mlflow_param_keys(cfg: BaseModel, prefix: str = "") -> list[str]:
    """Dotted names of the fields of ``cfg`` (this instance's union members) that are a run's MLflow
    params: every field that is not ``RESUME_SAFE`` (those decide none of its numbers) and every
    ``RESUME_SAFE_PARAM`` one (a resumed run may change it, yet it decides numbers: the budget, the
    decoder, the thread count); without the settings of a backend that does not run it. A mapping's entries are params each."""
    keys: list[str] = []
    idle = cfg.idle_sections() if hasattr(cfg, "idle_sections") else set()
    for name, field in type(cfg).model_fields.items():
        value = getattr(cfg, name)
        if name in idle:
            continue
        marks = field.json_schema_extra or {}
        if isinstance(value, BaseModel):
            keys += mlflow_param_keys(value, f"{prefix}{name}.")
        elif marks.get("mlflow_param") or not marks.get("resume_safe"):
            keys += [f"{prefix}{name}.{k}" for k in value] if isinstance(value, dict) else [f"{prefix}{name}"]
    return keys


def flatten(cfg: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> scalar value of a config (for MLflow params and search spaces)."""
    out: dict[str, Any] = {}
    for key, value in cfg.model_dump(mode="json").items():
        _flatten_into(out, f"{prefix}{key}", value)
    return out


def at_default(cfg: BaseModel, key: str) -> bool:
    """Whether the field at dotted ``key`` of ``cfg`` holds its schema default (False for a key that is not
    a field of nested models, e.g. one inside a dict)."""
    *path, name = key.split(".")
    node: Any = cfg
    for part in path:
        node = getattr(node, part, None)
        if not isinstance(node, BaseModel):
            return False
    field = type(node).model_fields.get(name)
    return field is not None and getattr(node, name) == field.get_default(call_default_factory=True)


def _flatten_into(out: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten_into(out, f"{key}.{k}", v)
    else:
        out[key] = value
