"""bench/aoti_liveness.py replays a wrapper's allocations and frees. The oracle is a wrapper excerpt
in torch 2.13's exact format (lines copied from a compiled Wan VAE program, sizes shrunk) whose
live bytes are counted by hand below."""
from __future__ import annotations

import importlib.util

from conftest import REPO

WRAPPER = """\
        static constexpr int64_t int_array_1[] = {1L, 96L, 6L, 4L, 8L};
        static constexpr int64_t int_array_2[] = {18432L, 192L, 32L, 8L, 1L};
        AtenTensorHandle false_graph_0_buf180_handle;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(5, int_array_1, int_array_2, cached_torch_dtype_float32, cached_torch_device_type_cpu, this->device_idx_, &false_graph_0_buf180_handle));
        auto false_graph_0_buf179 = wrap_with_raii_handle_if_needed(reinterpret_tensor_wrapper(false_graph_0_buf180, 5, int_array_1, int_array_2, 0L));  // alias
        AtenTensorHandle false_graph_0_buf186_handle;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(5, int_array_1, int_array_2, cached_torch_dtype_bfloat16, cached_torch_device_type_cpu, this->device_idx_, &false_graph_0_buf186_handle));
        AtenTensorHandle false_graph_0_buf5_handle;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_convolution(false_graph_0_buf4, false_graph_0_arg1_1, &temporary_reference(false_graph_0_arg0_1.get()), std::array<int64_t, 3>{1L, 1L, 1L}.cbegin(), 3, 0, 3, 1L, &false_graph_0_buf5_handle));
        RAIIAtenTensorHandle false_graph_0_buf5(false_graph_0_buf5_handle);
        if (_check_aoti_runtime_check_inputs_env()) { assert_size_stride(false_graph_0_buf5, {1L, 384L, 1L, 3L, 5L}, {5760L, 15L, 15L, 5L, 1L}, "torch.ops.aten.convolution.default"); }
        false_graph_0_buf180.reset();
        false_graph_0_arg1_1.reset();
        AtenTensorHandle true_graph_0_buf1_handle;
        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(5, int_array_1, int_array_2, cached_torch_dtype_float32, cached_torch_device_type_cpu, this->device_idx_, &true_graph_0_buf1_handle));
        false_graph_0_buf186.reset();
"""


def _tool():
    spec = importlib.util.spec_from_file_location("aoti_liveness", REPO / "bench" / "aoti_liveness.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_replay_counts_allocations_frees_and_extern_outputs_of_one_branch():
    res = _tool().replay(WRAPPER.splitlines(), "false_graph_0_")
    f32, bf16, conv = 96 * 6 * 4 * 8 * 4, 96 * 6 * 4 * 8 * 2, 384 * 3 * 5 * 4
    assert res["peak"] == f32 + bf16 + conv and res["peak_line"] == 9  # the conv output's line
    assert set(res["at_peak"]) == {"false_graph_0_buf180", "false_graph_0_buf186", "false_graph_0_buf5"}
    assert res["end"] == conv and res["unsized"] == []  # the other branch's buffer is not counted


def test_the_top_level_graph_counts_no_branch_buffer():
    """prefix "": only buffers named buf* at the top level; a branch's `false_graph_0_buf180.reset()`
    must not free a top-level buf180."""
    top = ["        static constexpr int64_t int_array_9[] = {4L, 4L};",
           "        AOTI_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(2, int_array_9, int_array_9, "
           "cached_torch_dtype_float32, cached_torch_device_type_cpu, this->device_idx_, &buf180_handle));"]
    res = _tool().replay(top + WRAPPER.splitlines(), "")
    assert res["peak"] == res["end"] == 4 * 4 * 4 and set(res["at_peak"]) == {"buf180"}


def test_an_unreadable_package_is_a_clear_error(tmp_path, capsys):
    import pytest

    bad = tmp_path / "vae.rank0.pt2"
    bad.write_text("not a zip")
    with pytest.raises(SystemExit, match=f"error: {bad}: not a readable .pt2 package"):
        _tool().main([str(bad)])


def test_an_extern_output_without_a_stated_size_is_reported_not_guessed():
    lines = [l for l in WRAPPER.splitlines() if "assert_size_stride" not in l]
    res = _tool().replay(lines, "false_graph_0_")
    assert res["unsized"] == ["false_graph_0_buf5"] and res["peak"] == 96 * 6 * 4 * 8 * 6
