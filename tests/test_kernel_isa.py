"""Which instruction set the CPU kernels are built for (no build, no CPU requirement)."""

import pytest

from quickdraft import kernels

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
AMX = AVX512 | {"amx_tile", "amx_bf16"}


@pytest.fixture(autouse=True)
def tiles_granted(monkeypatch):
    """Linux grants the tile registers unless a test says otherwise (no syscall in these tests)."""
    monkeypatch.setattr(kernels, "_tile_registers_granted", lambda: True)


@pytest.mark.parametrize(("flags", "expected"), [
    (AMX, "amx_bf16"),
    (AMX - {"amx_bf16"}, "avx512_bf16"),  # tiles without bf16 products
    (AVX512, "avx512_bf16"),
    (AVX512 - {"avx512_bf16"}, "avx2"),  # AVX-512 without bf16 dot products: the AVX2 build
    (AVX512 - {"avx512dq"}, "avx2"),  # the noise's 64-bit products need DQ (every bf16 CPU has it)
    (AVX512 - {"avx512_vnni"}, "avx2"),  # the drafts' int8 products need VNNI (every bf16 CPU has it)
    ({"avx2", "fma", "f16c"}, "avx2"),
    ({"avx2"}, None),  # no fused multiply-add
    (set(), None),  # not x86, or no /proc/cpuinfo
])
def test_the_best_instruction_set_the_cpu_has(monkeypatch, flags, expected):
    monkeypatch.delenv("QUICKDRAFT_KERNELS_ISA", raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: flags)
    assert kernels.isa() == expected


def test_tiles_the_kernel_refuses_to_lend_mean_the_avx512_build(monkeypatch):
    monkeypatch.delenv("QUICKDRAFT_KERNELS_ISA", raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: AMX)
    monkeypatch.setattr(kernels, "_tile_registers_granted", lambda: False)
    assert kernels.isa() == "avx512_bf16"


def test_a_lesser_instruction_set_can_be_chosen_but_not_a_missing_one(monkeypatch):
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: AMX)
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "avx512_bf16")
    assert kernels.isa() == "avx512_bf16"
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: AVX512)
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "avx2")
    assert kernels.isa() == "avx2"
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: {"avx2", "fma"})
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "avx512_bf16")
    assert kernels.isa() is None
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "sse2")
    with pytest.raises(ValueError, match="amx_bf16, avx512_bf16, avx2"):
        kernels.isa()


def test_the_cpu_flags_are_read_from_the_flags_line(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\nbugs\t\t: spectre_v1\n")
    real_path = kernels.Path
    monkeypatch.setattr(kernels, "Path", lambda p: cpuinfo if p == "/proc/cpuinfo" else real_path(p))
    assert kernels._cpu_flags() == {"fpu", "avx2", "fma"}


def test_a_build_the_compiler_cannot_make_falls_back_to_a_lesser_one(monkeypatch, tmp_path):
    monkeypatch.delenv("QUICKDRAFT_KERNELS_ISA", raising=False)
    monkeypatch.setattr(kernels, "_cpu_flags", lambda: AMX)
    monkeypatch.setattr(kernels, "_compiler", lambda: "c++")
    monkeypatch.setattr(kernels, "_library_path", lambda compiler, flags: tmp_path / f"{len(flags)}.so")

    def build(compiler, library, flags):
        if "-mamx-tile" in flags:
            raise RuntimeError("unrecognized command-line option '-mamx-tile'")  # an older compiler
        library.touch()

    loaded = []
    monkeypatch.setattr(kernels, "_build_once", build)
    monkeypatch.setattr(kernels.torch.ops, "load_library", loaded.append)
    monkeypatch.setattr(kernels, "_register_fake", lambda: None)
    assert kernels.loaded_isa.__wrapped__() == "avx512_bf16" and len(loaded) == 1
    monkeypatch.setenv("QUICKDRAFT_KERNELS_ISA", "amx_bf16")  # a build asked for by name: no other
    assert kernels.loaded_isa.__wrapped__() is None and len(loaded) == 1
