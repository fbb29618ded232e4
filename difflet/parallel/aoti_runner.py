"""Run an AOTInductor package with the GIL released: required for programs that communicate.

Why: torch's Python bindings (`AOTICompiledModel` -> `AOTIModelPackageLoader.boxed_run`, also
`AOTIModelContainerRunnerCpu.run`) hold the GIL for the whole compiled call, including while
the program blocks in `_c10d_functional.wait_tensor` or waits to enqueue a collective. A gloo
worker thread that finishes a collective drops its Work under the process group's work mutex;
when that Work holds the last C++ reference but one to a tensor that has a Python object,
torch (>= 2.10 refcounting) calls `decref_pyobject`, which takes the GIL. Main thread waits on
gloo while holding the GIL, gloo waits on the GIL while holding the group's mutex: the rank
stops and its peers stop inside whatever collective they had reached (ranks in different
collectives at once). Eager collectives never showed it because `torch.ops` calls release the
GIL while the op runs.

Invariants:
- `NoGilRunner(program, weights[, constants, shared])(*tensors) -> tuple[Tensor, ...]` behaves like
  difflet.codegen.inductor.CompiledRunner (same package, same full constant update checked, on
  the same user-managed weights), except that the compiled call runs with the GIL released.
- The C++ shim is built once per source text by torch.utils.cpp_extension (cached under
  $TORCH_EXTENSIONS_DIR, file-locked, so concurrent rank workers build it once);
  `build()` in the parent before starting workers keeps the build out of their load time.
"""
from __future__ import annotations

from pathlib import Path

_SOURCE = r"""
#include <torch/extension.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

struct NoGilLoader {
  torch::inductor::AOTIModelPackageLoader loader;
  explicit NoGilLoader(const std::string& path) : loader(path) {}
  std::vector<std::string> constant_fqns() { return loader.get_constant_fqns(); }
  std::unordered_map<std::string, std::string> metadata() { return loader.get_metadata(); }
  // four arguments: torch 2.11's loader has no allow_h2d_copy (attach_constants places the tensors)
  void load_constants(std::unordered_map<std::string, at::Tensor> constants, bool user_managed) {
    loader.load_constants(constants, /*use_inactive=*/false, /*check_full_update=*/true, user_managed);
  }
  std::vector<at::Tensor> run(std::vector<at::Tensor> inputs) {
    // the reason this module exists: gloo threads may need the GIL while this call waits on them
    py::gil_scoped_release no_gil;
    return loader.boxed_run(std::move(inputs));
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<NoGilLoader>(m, "NoGilLoader")
      .def(py::init<const std::string&>())
      .def("constant_fqns", &NoGilLoader::constant_fqns)
      .def("metadata", &NoGilLoader::metadata)
      .def("load_constants", &NoGilLoader::load_constants)
      .def("run", &NoGilLoader::run);
}
"""

_module = None


def build():
    """The compiled shim module (built on first use, then loaded from the extension cache)."""
    global _module
    if _module is None:
        from torch.utils.cpp_extension import load_inline

        _module = load_inline("difflet_aoti_nogil", cpp_sources=[_SOURCE], extra_cflags=["-O1"],
                              verbose=False)
    return _module


class NoGilRunner:
    """A loaded AOTInductor package with its weights, called with the GIL released."""

    def __init__(self, program_path: Path, weights_path: Path, constants_path: Path | None = None,
                 shared: dict | None = None) -> None:
        from difflet.codegen.inductor import attach_constants, program_constants
        from difflet.errors import DiffletError

        try:
            self._loader = build().NoGilLoader(str(program_path))
        except RuntimeError as err:  # the loader raises bare RuntimeErrors from C++
            raise DiffletError(f"cannot load compiled program: {err}", where=program_path) from None
        weights = program_constants(list(self._loader.constant_fqns()), weights_path, constants_path, shared)
        # as CompiledRunner: the program points at these tensors (weights in memory once)
        self._constants = attach_constants(self._loader.load_constants, self._loader.metadata(), weights)

    def __call__(self, *tensors):
        return tuple(self._loader.run(list(tensors)))
