"""RBAC as kube-apiserver's authorizer applies it: Roles, ClusterRoles and their
bindings are ordinary stored objects; a request is allowed when a rule of a role
bound to the caller matches its verb, API group, resource and name.

`system:masters` (the server's own token) is always allowed, as upstream.
Every allowed request records the rule that allowed it, so a test can list the
granted rules nothing used (least privilege, checked).

Fidelity notes: aggregated ClusterRoles and escalation checks are not emulated;
discovery and OpenAPI paths and self-reviews are open to every authenticated
caller (upstream's `system:discovery`, `system:public-info-viewer` and
`system:basic-user` roles).
"""

from __future__ import annotations

import attrs

from egressd.sandbox.apiserver.reviews import Attributes, User
from egressd.sandbox.apiserver.store import Obj, Store

ROLES = "rbac.authorization.k8s.io/roles"
CLUSTER_ROLES = "rbac.authorization.k8s.io/clusterroles"
ROLE_BINDINGS = "rbac.authorization.k8s.io/rolebindings"
CLUSTER_ROLE_BINDINGS = "rbac.authorization.k8s.io/clusterrolebindings"
MASTERS = "system:masters"
# Reviews of oneself: every authenticated caller may create them.
_BASIC_USER = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews",
                         "selfsubjectreviews"})
_OPEN_PATHS = ("/api", "/apis", "/openapi", "/version", "/healthz", "/livez", "/readyz")


@attrs.frozen
class Grant:
    """One (verb, group, resource) a rule grants, named by where the rule lives."""

    role: str  # "ClusterRole/egressd" or "Role/egressd/egressd-leader-election"
    verb: str
    group: str
    resource: str

    def __str__(self) -> str:
        resource = f"{self.resource}.{self.group}" if self.group else self.resource
        return f"{self.role}: {self.verb} {resource}"


def _subject_matches(subject: object, user: User) -> bool:
    if not isinstance(subject, dict):
        return False
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "ServiceAccount":
        return user.name == f"system:serviceaccount:{subject.get('namespace', '')}:{name}"
    if kind == "User":
        return user.name == name
    if kind == "Group":
        return name in user.groups
    return False


def _listed(values: object, wanted: str) -> bool:
    return isinstance(values, list) and ("*" in values or wanted in values)


def _rule_allows(rule: object, a: Attributes) -> bool:
    if not isinstance(rule, dict):
        return False
    if a.resource:
        resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        names = rule.get("resourceNames") or []
        return (_listed(rule.get("verbs"), a.verb) and _listed(rule.get("apiGroups"), a.group)
                and _listed(rule.get("resources"), resource)
                and (not names or a.name in names))
    urls = rule.get("nonResourceURLs") or []
    return _listed(rule.get("verbs"), a.verb) and any(
        u == a.path or (u.endswith("*") and a.path.startswith(u[:-1])) for u in urls)


class RbacAuthorizer:
    """Decides from the RBAC objects in `store`; remembers which grants were used."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.used: set[Grant] = set()

    def _roles_for(self, user: User, namespace: str) -> list[tuple[str, Obj]]:
        """(name, role) of every role bound to `user`, cluster-wide or in `namespace`."""
        found: list[tuple[str, Obj]] = []
        for binding in self._store.items(CLUSTER_ROLE_BINDINGS, None):
            if any(_subject_matches(s, user) for s in binding.get("subjects") or ()):
                found += self._resolve(binding, "")
        if namespace:
            for binding in self._store.items(ROLE_BINDINGS, namespace):
                if any(_subject_matches(s, user) for s in binding.get("subjects") or ()):
                    found += self._resolve(binding, namespace)
        return found

    def _resolve(self, binding: Obj, namespace: str) -> list[tuple[str, Obj]]:
        ref = binding.get("roleRef") or {}
        name = str(ref.get("name", ""))
        if ref.get("kind") == "ClusterRole":
            role = self._store.get(CLUSTER_ROLES, "", name)
            return [(f"ClusterRole/{name}", role)] if role is not None else []
        role = self._store.get(ROLES, namespace, name) if namespace else None
        return [(f"Role/{namespace}/{name}", role)] if role is not None else []

    def allowed(self, user: User, attributes: Attributes) -> tuple[bool, str]:
        if MASTERS in user.groups:
            return True, ""
        if not attributes.resource and attributes.path.startswith(_OPEN_PATHS):
            return True, ""
        if attributes.verb == "create" and attributes.resource in _BASIC_USER:
            return True, ""  # upstream's system:basic-user role, bound to everyone
        for where, role in self._roles_for(user, attributes.namespace):
            for rule in role.get("rules") or ():
                if _rule_allows(rule, attributes):
                    resource = attributes.resource + (
                        f"/{attributes.subresource}" if attributes.subresource else "")
                    self.used.add(Grant(where, attributes.verb, attributes.group, resource))
                    return True, f'RBAC: allowed by {where}'
        return False, ""

    def rules(self, user: User, namespace: str) -> tuple[list[Obj], list[Obj]]:
        if MASTERS in user.groups:
            return ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                    [{"verbs": ["*"], "nonResourceURLs": ["*"]}])
        resource_rules: list[Obj] = []
        other: list[Obj] = []
        for _, role in self._roles_for(user, namespace):
            for rule in role.get("rules") or ():
                if isinstance(rule, dict):
                    (other if rule.get("nonResourceURLs") else resource_rules).append(rule)
        return resource_rules, other

    def granted(self) -> set[Grant]:
        """Every (verb, group, resource) the stored roles grant a bound subject."""
        grants: set[Grant] = set()
        bound: set[str] = set()
        for binding in [*self._store.items(CLUSTER_ROLE_BINDINGS, None),
                        *self._store.items(ROLE_BINDINGS, None)]:
            namespace = binding["metadata"].get("namespace", "")
            bound.update(where for where, _ in self._resolve(binding, namespace))
        roles = [(f"ClusterRole/{r['metadata']['name']}", r)
                 for r in self._store.items(CLUSTER_ROLES, None)]
        roles += [(f"Role/{r['metadata']['namespace']}/{r['metadata']['name']}", r)
                  for r in self._store.items(ROLES, None)]
        for where, role in roles:
            if where not in bound:
                continue
            for rule in role.get("rules") or ():
                if not isinstance(rule, dict) or rule.get("nonResourceURLs"):
                    continue
                for verb in rule.get("verbs") or ():
                    for group in rule.get("apiGroups") or ():
                        for resource in rule.get("resources") or ():
                            grants.add(Grant(where, verb, group, resource))
        return grants

    def unused(self) -> list[Grant]:
        """Granted (verb, group, resource) triples no allowed request needed, sorted."""
        return sorted(self.granted() - self.used, key=str)


def forbidden_message(user: User, a: Attributes) -> str:
    """kube-apiserver's wording of a 403."""
    if not a.resource:
        return f'forbidden: User "{user.name}" cannot {a.verb} path "{a.path}"'
    what = f"{a.resource}.{a.group}" if a.group else a.resource
    name = f' "{a.name}"' if a.name else ""
    resource = f'resource "{a.resource}"' + (
        f' subresource "{a.subresource}"' if a.subresource else "")
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    return (f'{what}{name} is forbidden: User "{user.name}" cannot {a.verb} {resource} '
            f'in API group "{a.group}" {scope}')
