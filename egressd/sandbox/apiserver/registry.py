"""The served resource types: the built-ins plus whatever stored CRDs define, with each
custom version's compiled schema (for writes) and raw schema (for /openapi/v3)."""

from __future__ import annotations

from typing import Any

from egressd.sandbox.apiserver.resources import BUILTINS, ResourceType, types_from_crd
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.validation import load_schema
from egressd.sandbox.schema import CRDSchema


class Registry:
    """Resource types by (group, version, plural); CRDs come and go as they are written."""

    def __init__(self) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {
            (rt.group, rt.version, rt.plural): rt for rt in BUILTINS}
        self._schemas: dict[str, CRDSchema] = {}
        self.openapi_schemas: dict[str, dict[str, Any]] = {}

    def get(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        return self._types[(group, version, plural)]

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def serves_group_version(self, group: str, version: str) -> bool:
        return any(t.group == group and t.version == version for t in self._types.values())

    def schema(self, rt: ResourceType) -> CRDSchema | None:
        """The compiled schema of a custom resource's version (None for built-ins)."""
        return self._schemas.get(f"{rt.crd_name}/{rt.version}") if rt.crd_name else None

    def register_crd(self, crd: Obj) -> None:
        self.unregister_crd(crd["metadata"]["name"])
        for rt in types_from_crd(crd):
            self._types[(rt.group, rt.version, rt.plural)] = rt
            for version in crd["spec"]["versions"]:
                if version["name"] == rt.version:
                    key = f"{rt.crd_name}/{rt.version}"
                    self._schemas[key] = load_schema(crd, rt.version)
                    self.openapi_schemas[key] = (version.get("schema") or {}).get(
                        "openAPIV3Schema") or {}

    def unregister_crd(self, crd_name: str) -> list[ResourceType]:
        """Stop serving a CRD's types; returns them (their objects are the caller's)."""
        removed = []
        for key, rt in list(self._types.items()):
            if rt.crd_name == crd_name:
                del self._types[key]
                self._schemas.pop(f"{crd_name}/{rt.version}", None)
                removed.append(rt)
        return removed
