"""`CRDSchema`: one CRD version's schema, digested once; prune, default, validate."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

import celpy

from egressd.sandbox.schema.cel import has_rules, run_rules
from egressd.sandbox.schema.checks import check
from egressd.sandbox.schema.nodes import Node, build_node
from egressd.sandbox.schema.values import (
    BLOCKING,
    INVALID,
    MISSING,
    RULES_NOT_CHECKED,
    FieldError,
    SchemaError,
    go_value,
    member_path,
)

# Root members the API server owns; the schema never prunes or defaults them.
ROOT_KEEP: Final = ("apiVersion", "kind", "metadata")


class CRDSchema:
    """The structural schema of one version of a CRD, with its CEL rules compiled once."""

    def __init__(self, root: Node, *, printer_columns: list[dict[str, Any]],
                 status_subresource: bool) -> None:
        self._root = root
        self._printer_columns = printer_columns
        self.status_subresource = status_subresource
        # kube-apiserver builds no CEL validator for a schema without rules, and only
        # that validator adds the "rules were not checked" cause.
        self._has_rules = has_rules(root)

    @classmethod
    def from_crd(cls, crd: Mapping[str, Any], version: str) -> CRDSchema:
        """Digest `crd` (an apiextensions.k8s.io/v1 CRD as a dict) for `version`.

        Raises `SchemaError` if the version is absent, a schema keyword has the wrong
        shape, a rule does not compile or a default fails its schema or rules.
        """
        spec = crd.get("spec") or {}
        for ver in spec.get("versions") or ():
            if ver.get("name") == version:
                break
        else:
            raise SchemaError(f"CRD {crd.get('metadata', {}).get('name')!r} has no version "
                              f"{version!r}")
        schema = ver.get("schema") or {}
        if not isinstance(schema, Mapping):
            raise SchemaError(f"version {version!r}: schema must be an object")
        raw = schema.get("openAPIV3Schema") or {
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        env = celpy.Environment()
        built = cls(
            build_node(raw, env, ""),
            printer_columns=copy.deepcopy(list(ver.get("additionalPrinterColumns") or ())),
            status_subresource="status" in (ver.get("subresources") or {}),
        )
        index = next(i for i, v in enumerate(spec["versions"]) if v is ver)
        built._check_defaults(built._root, f"spec.versions[{index}].schema.openAPIV3Schema")
        return built

    def _check_defaults(self, node: Node, where: str) -> None:
        """Refuse a `default` kube-apiserver refuses when the CRD is created.

        As its `ValidateDefaults`: each default, exactly as written (children's
        defaults are not applied to it first), must hold no field pruning would
        drop, pass the node's schema, then the node's CEL rules (with oldSelf = the
        default). additionalProperties is not followed, as there.
        """
        if node.default is not MISSING:
            path = f"{where}.default"
            pruned = copy.deepcopy(node.default)
            dropped: list[str] = []
            self._prune(node, pruned, path, dropped)
            errors = [FieldError(path, reason=INVALID, message=(
                f"Invalid value: {go_value(node.default)}: must not have unknown fields "
                f"({', '.join(dropped)})"))] if dropped else []
            check(node, node.default, path, errors)
            if not errors:
                run_rules(node, node.default, node.default, path, errors)
            if errors:
                raise SchemaError("; ".join(str(e) for e in errors))
        if node.items is not None:
            self._check_defaults(node.items, f"{where}.items")
        for key, child in node.properties.items():
            self._check_defaults(child, f"{where}.properties[{key}]")

    @property
    def printer_columns(self) -> list[dict[str, Any]]:
        """The version's `additionalPrinterColumns` (a copy), for Table rendering."""
        return copy.deepcopy(self._printer_columns)

    # -- pruning -------------------------------------------------------------------

    def prune(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """A copy of `obj` without the fields the schema does not know, and their paths.

        Honours `x-kubernetes-preserve-unknown-fields`, `additionalProperties` and
        embedded resources; `apiVersion`, `kind` and `metadata` at the root are kept.
        """
        out = copy.deepcopy(dict(obj))
        dropped: list[str] = []
        self._prune(self._root, out, "", dropped, root=True)
        return out, dropped

    def _prune(self, node: Node | None, value: Any, path: str, dropped: list[str], *,
               root: bool = False) -> None:
        if node is None:
            return
        if isinstance(value, dict):
            keep = ROOT_KEEP if (root or node.embedded) else ()
            for key in list(value):
                if key in keep:
                    continue
                child = node.child(key)
                child_path = (
                    member_path(path, key) if key in node.properties or node.additional is None
                    else f"{path}[{key}]"
                )
                if child is None and node.additional is None and not node.preserve_unknown:
                    dropped.append(child_path)
                    del value[key]
                else:
                    self._prune(child, value[key], child_path, dropped)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                self._prune(node.items, item, f"{path}[{i}]", dropped)

    # -- defaulting ------------------------------------------------------------------

    def apply_defaults(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of `obj` with every structural default applied, for spec and status alike.

        As in Kubernetes: a missing field (or a null one on a non-nullable field)
        gets its default, then the defaults below it (so `default: {}` fills its
        children's defaults); a null on a non-nullable field without a default is dropped.
        """
        out = copy.deepcopy(dict(obj))
        self._default(self._root, out, root=True)
        return out

    def _default(self, node: Node | None, value: Any, *, root: bool = False) -> None:
        if node is None:
            return
        if isinstance(value, dict):
            for key, prop in node.properties.items():
                if root and key in ROOT_KEEP:
                    continue
                present = key in value
                if present and value[key] is None and not prop.nullable:
                    if prop.default is MISSING:
                        del value[key]
                        continue
                    present = False
                if not present and prop.default is not MISSING:
                    value[key] = copy.deepcopy(prop.default)
            for key, item in value.items():
                if root and key in ROOT_KEEP:
                    continue
                self._default(node.child(key), item)
        elif isinstance(value, list):
            for item in value:
                self._default(node.items, item)

    # -- validation ------------------------------------------------------------------

    def validate(self, obj: Mapping[str, Any], old: Mapping[str, Any] | None = None,
                 ) -> list[FieldError]:
        """Every structural error of `obj`, then (if none blocks them) every failed CEL rule.

        `old` is the stored object on update: transition rules (those naming
        `oldSelf`) run only where an old value exists, so they are skipped on create.
        A rule that fails to evaluate (a missing field read without `has()`) rejects.
        """
        errors: list[FieldError] = []
        check(self._root, obj, "", errors, root=True)
        if any(e.reason in BLOCKING for e in errors):
            if self._has_rules:
                errors.append(RULES_NOT_CHECKED)
            return errors
        run_rules(self._root, obj, MISSING if old is None else old, "", errors, root=True)
        return errors
