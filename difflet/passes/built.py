"""What codegen builds, as data the planner reads: `--list-legal` never calls legal what
`difflet codegen` refuses, and codegen refuses with the same words.

Invariants:
- Torch-free. `split_built()` / `probe_built()` / `spmd_built()` / `blocks_built()` are the
  denoiser classes whose split / probe / neuron SPMD / block-mode programs codegen builds, as
  each family's facts list them (difflet/families/<family>/facts.py): the single list both the
  planner and codegen read. How each is built is its family's declaration
  (difflet/families/<family>/programs.py `CLASSES`, a `SplitDecl` / `ProbeDecl` / `BlockDecl`),
  present for exactly these classes (tests/test_passes_built.py).
- A legal plan is buildable iff `reasons(planned, backend)` is empty; codegen raises the first
  reason of the component it is about to build (`layout_reason`, `probe_reason`, `blocks_reason`).
- A cfg layout is built iff its class declares its branch inputs (the twins are in the IR) and
  its inner layout (one cfg group: world / cfg ranks) is built: an inner world of 1 is built for
  every class (each group runs the unsplit program), a larger one needs split_built().
"""
from __future__ import annotations

from difflet.ir.nodes import Module, Node, Op
from difflet.passes.backend_facts import BACKENDS, names_with
from difflet.passes.cfg_branch import has_twins
from difflet.passes.layout_attrs import Layout


def _built(field: str) -> tuple[str, ...]:
    """The classes every registered family lists in its facts' `field`."""
    from difflet.families import all_facts

    return tuple(cls for facts in all_facts().values() for cls in getattr(facts, field))


def split_built() -> tuple[str, ...]:
    """Denoiser classes whose split programs codegen builds."""
    return _built("split_built")


def probe_built() -> tuple[str, ...]:
    """Denoiser classes whose step-caching probe program codegen builds."""
    return _built("probe_built")


def blocks_built() -> tuple[str, ...]:
    """Denoiser classes codegen cuts into block mode's front and rest programs."""
    return _built("blocks_built")


def spmd_built() -> tuple[str, ...]:
    """Classes whose tp-only layouts the neuron backend builds as one NxD SPMD program
    (codegen/neuron_spmd.py: its only collectives are NxD's parallel linears)."""
    return _built("spmd_built")


def replica_world(layout_attrs) -> int:
    """Ranks of one data-parallel replica: a dp layout is built once, as dp=1 (every replica
    runs the same program on its own cores; the runtime starts one model process each)."""
    return Layout.of(layout_attrs).replica_world


def layout_reason(comp: Node, backend: str = "inductor", device: str | None = None) -> str | None:
    """Why codegen cannot build this planned component's layout for programs on `device` (the
    target's, passes/targets.py `program_device`) (None when it can)."""
    layouts = comp.find(Op.LAYOUT)
    la = layouts[0].attrs if layouts else None
    if la is None or replica_world(la) == 1:
        return None
    if device not in (None, "cpu"):  # rank workers compile and run their programs on the CPU, over gloo
        return f"split programs for {device} devices (one rank per device, NCCL) are not built yet: CPU ranks only"
    cls = comp.attrs.get("class")
    cfg = int(la.get("cfg", 1))
    if cfg > 1 and not has_twins(comp):
        return (f"cfg layouts of {cls} are not built: its class declares no inputs of the unconditional "
                "pass (its family's split rules `cfg_branch`)")
    if replica_world(la) // cfg > 1 and cls not in split_built():
        built = ", ".join(c.rpartition(".")[2] for c in split_built())
        return f"split programs of {cls} are not built yet (built: {built})"
    facts = BACKENDS.get(backend)
    if facts is None or not facts.split_programs:
        split = ", ".join(names_with("split_programs"))
        return f"split programs are built for the {split} backends only so far, not {backend}"
    return spmd_reason(comp, la, backend) if facts.spmd_splits else None


def spmd_reason(comp: Node, la, backend: str) -> str | None:
    """Why an SPMD backend (backend_facts `spmd_splits`) cannot build this split layout (None when it can)."""
    if la.get("sp") or int(la.get("cp", 1)) > 1:
        return f"the {backend} backend builds tp-only split programs (one NxD SPMD program) so far, not sp or cp"
    if comp.attrs.get("class") not in spmd_built():
        built = ", ".join(c.rpartition(".")[2] for c in spmd_built())
        return f"{backend} SPMD programs of {comp.attrs.get('class')} are not built yet (built: {built})"
    return None


def probe_reason(probe: Node) -> str | None:
    """Why codegen cannot build this probe node (None when it can)."""
    if probe.attrs.get("mode") != "separate":
        return (f"probe mode {probe.attrs.get('mode')!r} is not supported by codegen yet; use "
                "`difflet opt --probe separate`")
    if probe.attrs.get("class") not in probe_built():
        return f"no probe program for denoiser class {probe.attrs.get('class')!r}"
    return None


def blocks_reason(comp: Node, backend: str = "inductor") -> str | None:
    """Why codegen cannot cut this planned denoiser into front and rest (None when it can or
    when it is not cut)."""
    if not comp.attrs.get("front_blocks"):
        return None
    if comp.attrs.get("class") not in blocks_built():
        return f"block programs of {comp.attrs.get('class')} are not built"
    facts = BACKENDS.get(backend)
    if facts is None or not facts.block_programs:
        return (f"block programs are built for the {', '.join(names_with('block_programs'))} backends only "
                f"so far, not {backend}")
    layouts = comp.find(Op.LAYOUT)
    if layouts and replica_world(layouts[0].attrs) > 1:
        la = Layout.of(layouts[0].attrs)
        if la.sp or la.cp > 1 or la.cfg > 1:  # tp alone keeps every block's streams whole on each rank
            return "block programs of split layouts are built for tp alone so far (no sp, cp or cfg)"
    if comp.attrs.get("bucket") is not None:
        return "block programs with shape buckets are not built"
    return None


def reasons(planned: Module, backend: str = "inductor") -> list[tuple[str, str]]:
    """(component, reason) for everything in a planned module that codegen would refuse."""
    from difflet.passes.targets import program_device

    device = program_device(planned.attrs.get("target"))
    out = [(c.name, r) for c in planned.components() if (r := layout_reason(c, backend, device))]
    out += [(p.name, r) for p in planned.find(Op.PROBE) if (r := probe_reason(p))]
    out += [(c.name, r) for c in planned.components() if (r := blocks_reason(c, backend))]
    return out
