# SPDX-License-Identifier: Apache-2.0
"""Make PyPI's torchvision importable next to a CPU-only torch build.

torchvision's compiled ops (_C.so) fail to load beside torch+cpu, and then
torchvision/_meta_registrations.py dies at import with
``RuntimeError: operator torchvision::nms does not exist`` because it calls
``torch.library.register_fake("torchvision::nms")`` unconditionally.
Defining the operator schemas first is enough: vLLM only needs torchvision's
pure-torch image transforms.

Installed by tests/vllm/venv.sh into the venv's site-packages together with
``ecx_tvfix.pth`` (a .pth, not sitecustomize.py: Debian's
/usr/lib/python3.11/sitecustomize.py comes first on sys.path and would shadow
a venv one).  The .pth runs in every interpreter started from the venv,
including the worker processes vLLM spawns.  To keep unrelated processes
(pip, ...) fast, torch is only imported when torchvision itself is imported:
a meta-path hook defines the schemas just before torchvision's first import.
"""
import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align": ("roi_align(Tensor input, Tensor rois, float spatial_scale, "
                  "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
                  "bool aligned) -> Tensor"),
}
_lib = None


def define_ops():
    global _lib
    if _lib is not None:
        return
    import torch
    missing = []
    for name in _SCHEMAS:
        try:
            getattr(torch.ops.torchvision, name)
        except (AttributeError, RuntimeError):
            missing.append(name)
    if not missing:
        _lib = False
        return
    _lib = torch.library.Library("torchvision", "DEF")  # keep a reference
    for name in missing:
        _lib.define(_SCHEMAS[name])


class _Hook:
    def find_spec(self, name, path=None, target=None):
        if name == "torchvision":
            sys.meta_path.remove(self)
            try:
                define_ops()
            except Exception as e:  # never break the interpreter
                print(f"ecx_tvfix: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def install():
    if "torchvision" in sys.modules:
        define_ops()
    elif not any(isinstance(h, _Hook) for h in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
