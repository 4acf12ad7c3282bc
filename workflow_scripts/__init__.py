"""Code behind the CPU training study workflow.

Modules that run inside a backend environment (``harness``, ``probe``, ``models``,
``data``, ``sysinfo``, ``metrics``) need only the standard library and
torch/torchvision (``launch`` uses ``probe``'s pure helpers, which import no torch).
Modules that run in the workflow's own environment (``study``, ``envs``,
``launch``, ``report``) may also use pandas, matplotlib, jsonschema and yaml.
"""

__all__: list[str] = []
