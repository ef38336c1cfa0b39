"""The one Kubernetes client part (docs/design.md, Decisions): the operator and the gateway reach
the Kubernetes API only through it.

- `names`: object names and namespaces checked by Kubernetes' own rules (pure);
- `resources`: `Resource`, the typed resources trainsentry touches, and their API paths,
  every segment percent-encoded (pure);
- `client`: `Kube`, generic get/list/create/patch/delete on plain-dict objects with one
  retry policy, names checked before any request; `LazyApiClient`; `default_api_client`;
- `events`: the core/v1 Event builder (pure).

It imports no other part of trainsentry.
"""
