"""Who am I, and may I: SelfSubjectReview, SelfSubjectAccessReview and
SelfSubjectRulesReview (`kubectl auth whoami`, `kubectl auth can-i [--list]`).

Reviews are answered, never stored. The caller is the `User` its bearer token
names; an `Authorizer` decides what it may do (everything, unless the server
enforces RBAC).
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from egressd.sandbox.apiserver import bodies
from egressd.sandbox.apiserver.errors import bad_request
from egressd.sandbox.apiserver.resources import ResourceType
from egressd.sandbox.apiserver.respond import json_response
from egressd.sandbox.apiserver.store import Obj
from egressd.sandbox.apiserver.wire import Request, Response


@attrs.frozen
class User:
    """An authenticated caller, as a `UserInfo`."""

    name: str
    groups: tuple[str, ...] = ("system:authenticated",)
    uid: str = ""

    def info(self) -> Obj:
        info: Obj = {"username": self.name, "groups": list(self.groups)}
        if self.uid:
            info["uid"] = self.uid
        return info


# The holder of the server's own token: a cluster admin, as kubeadm's admin.conf.
ADMIN = User("sandbox-admin", ("system:masters", "system:authenticated"))


@attrs.frozen
class Attributes:
    """One request as an authorizer sees it (resource or non-resource)."""

    verb: str
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""  # a non-resource URL (then resource is "")


class Authorizer(Protocol):
    def allowed(self, user: User, attributes: Attributes) -> tuple[bool, str]:
        """Whether `user` may, and the reason shown in an access review."""

    def rules(self, user: User, namespace: str) -> tuple[list[Obj], list[Obj]]:
        """The (resource rules, non-resource rules) `user` holds in `namespace`."""


class AllowAll:
    """No authorization: every authenticated caller may do anything."""

    def allowed(self, user: User, attributes: Attributes) -> tuple[bool, str]:
        return True, ""

    def rules(self, user: User, namespace: str) -> tuple[list[Obj], list[Obj]]:
        return ([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
                [{"verbs": ["*"], "nonResourceURLs": ["*"]}])


def answer(rt: ResourceType, request: Request, *, user: User,
           authorizer: Authorizer) -> Response:
    if rt.kind == "SelfSubjectReview":
        # Nothing in its body matters (kubectl sends it as protobuf): answer the caller.
        return json_response(201, {"kind": rt.kind, "apiVersion": rt.api_version,
                                   "metadata": {"creationTimestamp": None},
                                   "status": {"userInfo": user.info()}})
    body = bodies.decoded(request, rt) if request.body.strip() else {}
    if not isinstance(body, dict):
        raise bad_request("the body of the request is not a JSON object")
    bodies.check_type(rt, body)
    spec = body.get("spec") or {}
    if not isinstance(spec, dict):
        raise bad_request("spec: must be an object")
    status: Obj
    if rt.kind == "SelfSubjectAccessReview":
        status = _access(spec, user, authorizer)
    else:
        resource_rules, other_rules = authorizer.rules(user, str(spec.get("namespace", "")))
        status = {"resourceRules": resource_rules, "nonResourceRules": other_rules,
                  "incomplete": False}
    out: dict[str, Any] = {"kind": rt.kind, "apiVersion": rt.api_version,
                           "metadata": {"creationTimestamp": None}, "spec": spec,
                           "status": status}
    return json_response(201, out)


def _access(spec: Obj, user: User, authorizer: Authorizer) -> Obj:
    resource = spec.get("resourceAttributes")
    other = spec.get("nonResourceAttributes")
    if isinstance(resource, dict):
        attributes = Attributes(
            verb=str(resource.get("verb", "")), group=str(resource.get("group", "")),
            resource=str(resource.get("resource", "")),
            subresource=str(resource.get("subresource", "")),
            namespace=str(resource.get("namespace", "")), name=str(resource.get("name", "")))
    elif isinstance(other, dict):
        attributes = Attributes(verb=str(other.get("verb", "")), path=str(other.get("path", "")))
    else:
        raise bad_request("spec: Invalid value: exactly one of nonResourceAttributes or "
                          "resourceAttributes must be specified")
    allowed, reason = authorizer.allowed(user, attributes)
    status: Obj = {"allowed": allowed}
    if reason:
        status["reason"] = reason
    if not allowed:
        status["denied"] = False  # no opinion, as RBAC answers
    return status
