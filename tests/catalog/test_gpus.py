"""GPU catalog: lookups, error messages and sanity relations between datasheet numbers."""

from __future__ import annotations

import json

import pytest

from tunebench.catalog.gpus import ARCHITECTURES, DATA, GPUSpec, _key, get_gpu, list_gpus, load_gpus
from tunebench.errors import InputError

LABELS = [
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-SXM4-40GB",
    "NVIDIA-A100-PCIE-40GB",
    "NVIDIA-H100-PCIe",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-NVL",
    "NVIDIA-H200",
    "NVIDIA-H200-NVL",
    "NVIDIA-B200",
    "NVIDIA-L40S",
    "NVIDIA-L40",
    "NVIDIA-L4",
    "NVIDIA-A10G",
    "NVIDIA-A10",
    "NVIDIA-RTX-A6000",
    "NVIDIA-RTX-6000-Ada-Generation",
    "NVIDIA-GeForce-RTX-4090",
    "NVIDIA-GeForce-RTX-3090",
    "Tesla-V100-SXM2-16GB",
    "Tesla-V100-SXM2-32GB",
    "Tesla-V100-PCIE-16GB",
    "Tesla-V100-PCIE-32GB",
    "Tesla-T4",
    "NVIDIA-A800-SXM4-80GB",
    "NVIDIA-H800",
    "NVIDIA-H20",
    "NVIDIA-GB200",
    "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
    "NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition",
    "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
    "AMD_Instinct_MI300X_OAM",
    "AMD_Instinct_MI325_OAM",
]


def test_catalog_holds_exactly_the_expected_labels():
    assert sorted(load_gpus()) == sorted(LABELS)


@pytest.mark.parametrize("label", LABELS)
def test_every_label_resolves_to_itself(label):
    spec = get_gpu(label)
    assert isinstance(spec, GPUSpec) and spec.name == label
    assert get_gpu(label.lower()).name == label


@pytest.mark.parametrize(
    ("value", "label"),
    [
        ("A100", "NVIDIA-A100-SXM4-80GB"),
        ("A100-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("A100-40GB", "NVIDIA-A100-SXM4-40GB"),
        ("A100-80GB-PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe"),
        ("H100", "NVIDIA-H100-80GB-HBM3"),
        ("H100-SXM", "NVIDIA-H100-80GB-HBM3"),
        ("h100-pcie", "NVIDIA-H100-PCIe"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("H100-NVL", "NVIDIA-H100-NVL"),
        ("H200", "NVIDIA-H200"),
        ("H200-NVL", "NVIDIA-H200-NVL"),
        ("B200", "NVIDIA-B200"),
        ("L40S", "NVIDIA-L40S"),
        ("L40", "NVIDIA-L40"),
        ("L4", "NVIDIA-L4"),
        ("A10G", "NVIDIA-A10G"),
        ("A10", "NVIDIA-A10"),
        ("A6000", "NVIDIA-RTX-A6000"),
        ("RTX-A6000", "NVIDIA-RTX-A6000"),
        ("RTX-6000-Ada", "NVIDIA-RTX-6000-Ada-Generation"),
        ("RTX4090", "NVIDIA-GeForce-RTX-4090"),
        ("rtx 4090", "NVIDIA-GeForce-RTX-4090"),
        ("RTX-3090", "NVIDIA-GeForce-RTX-3090"),
        ("V100", "Tesla-V100-SXM2-16GB"),
        ("V100-32GB", "Tesla-V100-SXM2-32GB"),
        ("T4", "Tesla-T4"),
        ("Tesla T4", "Tesla-T4"),
        ("tesla_t4", "Tesla-T4"),
        ("NVIDIA-L40S-SHARED", "NVIDIA-L40S"),  # GFD time-slicing suffix
        # values used by the reference system (IBM ado)
        ("Tesla-T4", "Tesla-T4"),
        ("Tesla-V100-PCIE-16GB", "Tesla-V100-PCIE-16GB"),
        ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3"),
    ],
)
def test_aliases_resolve(value, label):
    assert get_gpu(value).name == label


def test_unknown_gpu_is_an_input_error_with_suggestion():
    with pytest.raises(InputError) as info:
        get_gpu("NVIDIA-A100-80GB-PCI")
    text = str(info.value)
    assert text.startswith("gpu_model:")
    assert "Did you mean" in text and "NVIDIA-A100-80GB-PCIe" in text
    assert "allowed:" in text


def test_unknown_gpu_without_near_miss():
    with pytest.raises(InputError) as info:
        get_gpu("TPU-v5e")
    assert str(info.value).startswith("gpu_model: unknown GPU 'TPU-v5e'; give its numbers")
    assert "Did you mean" not in str(info.value)


def test_no_alias_is_shared_between_gpus():
    owner: dict[str, str] = {}
    for spec in load_gpus().values():
        for text in (spec.name, *spec.aliases):
            key = _key(text)
            assert owner.setdefault(key, spec.name) == spec.name, f"{text!r} names {owner[key]} and {spec.name}"


def test_aliases_within_a_gpu_are_unique():
    for spec in load_gpus().values():
        assert len(set(spec.aliases)) == len(spec.aliases), spec.name


def test_list_order_is_by_architecture_then_memory():
    ordered = list_gpus()
    assert len(ordered) == len(LABELS)
    keys = [(ARCHITECTURES.index(g.architecture), g.memory_mib) for g in ordered]
    assert keys == sorted(keys)
    assert ordered[0].architecture == "Volta" and ordered[-1].name == "NVIDIA-GB200"


def test_json_meta_and_field_types():
    raw = json.loads((DATA / "gpus.json").read_text(encoding="utf-8"))
    assert set(raw["_meta"]) >= {"description", "units", "sources_note"}
    for spec in load_gpus().values():
        assert spec.architecture in ARCHITECTURES
        assert spec.form_factor in ("SXM", "PCIe", "OAM", "Superchip")
        assert spec.confidence in ("datasheet", "unverified")
        assert spec.source, spec.name
        assert spec.pcie_gen in (3, 4, 5, 6)
        assert spec.memory_gib == round(spec.memory_mib / 1024, 2)


@pytest.mark.parametrize("spec", list(load_gpus().values()), ids=lambda s: s.name)
def test_per_gpu_sanity(spec):
    if spec.architecture in ("Volta", "Turing"):
        assert spec.bf16_tflops is None and spec.tf32_tflops is None
    else:
        assert spec.bf16_tflops is not None and spec.tf32_tflops is not None
        assert spec.bf16_tflops <= spec.fp16_tflops
        assert spec.fp32_tflops <= spec.tf32_tflops < spec.bf16_tflops
    assert spec.tensor_tflops > spec.fp32_tflops
    # GB -> GiB is x0.931; vendors' "GB" is mostly binary, so allow 8 %
    assert abs(spec.memory_gib / (spec.memory_gb_nominal * 0.931) - 1) <= 0.08
    assert spec.memory_gib <= spec.memory_gb_nominal * 1.0001
    assert spec.intra_node_bandwidth_gbps >= {3: 32, 4: 64, 5: 128, 6: 256}[spec.pcie_gen] or spec.form_factor == "SXM"
    assert (
        spec.compute_capability.split(".")[0]
        in {  # Blackwell: 10 (B200, GB200), 12 (RTX PRO, GeForce)
            "Volta": ("7",),
            "Turing": ("7",),
            "Ampere": ("8",),
            "Ada": ("8",),
            "Hopper": ("9",),
            "Blackwell": ("10", "12"),
            "CDNA3": ("gfx942",),
        }[spec.architecture]
    )


def test_datasheet_relations():
    g = get_gpu
    # dense BF16: B200 > H100 SXM = H200 > H100 NVL > H100 PCIe > RTX 6000 Ada > L40S > A100 > L40 > 4090 > A6000
    assert g("B200").bf16_tflops > g("H100").bf16_tflops == g("H200").bf16_tflops
    assert g("H100").bf16_tflops > g("H100-NVL").bf16_tflops > g("H100-PCIe").bf16_tflops
    assert g("H100-PCIe").bf16_tflops > g("RTX-6000-Ada").bf16_tflops > g("L40S").bf16_tflops
    assert g("L40S").bf16_tflops > g("A100-80GB").bf16_tflops > g("L40").bf16_tflops
    assert g("L40").bf16_tflops > g("RTX4090").bf16_tflops > g("A6000").bf16_tflops
    assert g("L40S").bf16_tflops == pytest.approx(2 * g("L40").bf16_tflops, rel=0.01)
    # the A100 variants share the die: same peak, different memory / power
    a100s = [g(x) for x in ("A100-80GB", "A100-40GB", "A100-80GB-PCIe", "A100-40GB-PCIe")]
    assert {s.bf16_tflops for s in a100s} == {312.0}
    bandwidth = [g(x).memory_bandwidth_gbps for x in ("A100-80GB", "A100-80GB-PCIe", "A100-40GB")]
    assert bandwidth == sorted(bandwidth, reverse=True) and len(set(bandwidth)) == 3
    # memory bandwidth ladder
    assert g("B200").memory_bandwidth_gbps > g("H200").memory_bandwidth_gbps > g("H100-NVL").memory_bandwidth_gbps
    assert g("H100-NVL").memory_bandwidth_gbps > g("H100").memory_bandwidth_gbps > g("A100-80GB").memory_bandwidth_gbps
    # memory as nvidia-smi reports it
    assert g("A100-80GB").memory_gib == 80.0
    assert g("H100").memory_gib == pytest.approx(79.65, abs=0.01)
    assert g("H200").memory_gib == pytest.approx(140.4, abs=0.01)
    assert g("L40S").memory_gib == pytest.approx(44.99, abs=0.01)
    # interconnect: SXM NVLink beats any PCIe part
    assert g("H100").intra_node_bandwidth_gbps == 900 and g("A100-80GB").intra_node_bandwidth_gbps == 600
    assert g("L40S").intra_node_bandwidth_gbps == 64 and g("T4").intra_node_bandwidth_gbps == 32
    assert g("T4").fp16_tflops == 65.0 and g("V100").fp16_tflops == 125.0


# Each GPU added for current data-centre and workstation parts: label, aliases, memory (MiB as nvidia-smi or
# rocm-smi reports it, where a public log shows it) and dense BF16 TFLOP/s (gpus.json holds each source).
NEW_GPUS = [
    ("NVIDIA-GB200", ("GB200", "GB200-NVL72", "NVIDIA GB200"), 189471, 2500.0),
    ("NVIDIA-H20", ("H20", "NVIDIA H20"), 97871, 148.0),
    ("NVIDIA-H800", ("H800", "NVIDIA H800"), 81559, 989.4),
    ("NVIDIA-A800-SXM4-80GB", ("A800", "A800-80GB", "NVIDIA A800-SXM4-80GB"), 81920, 312.0),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
     ("RTX-PRO-6000", "RTX PRO 6000 Server", "NVIDIA RTX PRO 6000 Blackwell Server Edition"), 97887, 503.8),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Workstation-Edition",
     ("RTX-PRO-6000-Workstation", "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"), 97887, 503.8),
    ("NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition",
     ("RTX-PRO-6000-Max-Q", "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"), 97887, 440.4),
    ("AMD_Instinct_MI300X_OAM", ("MI300X", "mi300x", "AMD Instinct MI300X", "AMD Instinct MI300X OAM"), 196592, 1307.4),
    ("AMD_Instinct_MI325_OAM", ("MI325X", "AMD Instinct MI325X", "AMD_Instinct_MI325X_OAM"), 262128, 1307.4),
]  # fmt: skip


@pytest.mark.parametrize(("label", "aliases", "memory_mib", "bf16"), NEW_GPUS, ids=[g[0] for g in NEW_GPUS])
def test_new_gpus_resolve_with_their_memory_and_dense_bf16(label, aliases, memory_mib, bf16):
    for value in (label, *aliases):
        spec = get_gpu(value)
        assert spec.name == label, value
        assert spec.memory_mib == memory_mib and spec.bf16_tflops == bf16 and spec.tensor_tflops == bf16


def test_new_gpus_against_their_siblings():
    g = get_gpu
    # export variants: the sibling's compute and memory, NVLink cut to 400 GB/s
    assert g("H800").bf16_tflops == g("H100").bf16_tflops and g("H800").memory_mib == g("H100").memory_mib
    assert g("A800").bf16_tflops == g("A100").bf16_tflops and g("A800").memory_mib == g("A100").memory_mib
    assert g("H800").intra_node_bandwidth_gbps == g("A800").intra_node_bandwidth_gbps == 400
    # H20: compute-limited Hopper with more and faster memory than the H100
    assert (
        g("H20").bf16_tflops < g("L40S").bf16_tflops
        and g("H20").memory_bandwidth_gbps > g("H100").memory_bandwidth_gbps
    )
    # GB200 runs the B200 die faster, with more memory; one NVLink domain per rack
    assert g("GB200").bf16_tflops > g("B200").bf16_tflops and g("GB200").memory_mib > g("B200").memory_mib
    # the three RTX PRO 6000: one GB202 with 96 GB GDDR7; Max-Q is the 300 W part
    pros = [g("RTX-PRO-6000"), g("RTX-PRO-6000-Workstation"), g("RTX-PRO-6000-Max-Q")]
    assert {p.memory_mib for p in pros} == {97887} and pros[2].bf16_tflops < pros[1].bf16_tflops
    assert pros[2].tdp_watts == 300 and all(p.compute_capability == "12.0" for p in pros)
    # AMD: CDNA3, gfx942, OAM modules; the MI325X is the MI300X with more, faster memory
    amd = [g("MI300X"), g("MI325X")]
    assert {a.architecture for a in amd} == {"CDNA3"} and {a.form_factor for a in amd} == {"OAM"}
    assert amd[0].bf16_tflops == amd[1].bf16_tflops and amd[1].memory_bandwidth_gbps > amd[0].memory_bandwidth_gbps
    assert g("MI300X").memory_gib == pytest.approx(191.98, abs=0.01)


def test_unverified_entries_say_why():
    for spec in load_gpus().values():
        if spec.confidence == "unverified":
            assert spec.notes, spec.name


# -- MIG slices: sized by their own share ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "name", "memory_gib", "compute", "memory"),
    [
        # NVIDIA MIG user guide, "Supported MIG Profiles": A100 3g profiles hold 3/7 of the SMs and 4/8 of the memory
        ("NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 40.0, 3 / 7, 4 / 8),
        ("A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", 5.0, 1 / 7, 1 / 8),  # GFD without NVIDIA-
        ("nvidia-h100-80gb-hbm3-mig-7g.80gb", "NVIDIA-H100-80GB-HBM3-MIG-7g.80gb", 79.65, 7 / 7, 8 / 8),
        ("NVIDIA-H200-MIG-3g.71gb", "NVIDIA-H200-MIG-3g.71gb", 70.2, 3 / 7, 4 / 8),
        ("NVIDIA-A100-SXM4-80GB-MIG-1c.3g.40gb", "NVIDIA-A100-SXM4-80GB-MIG-1c.3g.40gb", 40.0, 1 / 7, 4 / 8),
        ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb+me", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 10.0, 1 / 7, 1 / 8),
    ],
)
def test_mig_slice_is_sized_by_its_share(label, name, memory_gib, compute, memory):
    from tunebench.catalog.gpus import is_known_gpu, is_mig

    mig, whole = get_gpu(label), get_gpu(name.split("-MIG-")[0])
    assert mig.name == name and is_mig(label) and is_known_gpu(label) and not is_mig(whole.name)
    assert mig.memory_gib == pytest.approx(memory_gib, abs=0.01)
    assert mig.memory_bytes == pytest.approx(whole.memory_bytes * memory, rel=1e-4)
    assert mig.bf16_tflops == pytest.approx(whole.bf16_tflops * compute, abs=0.01)
    assert mig.fp32_tflops == pytest.approx(whole.fp32_tflops * compute, abs=0.01)
    assert mig.memory_bandwidth_gbps == pytest.approx(whole.memory_bandwidth_gbps * memory, abs=0.1)
    assert mig.intra_node_bandwidth_gbps < whole.intra_node_bandwidth_gbps  # no NVLink peer-to-peer between slices


@pytest.mark.parametrize(
    "label",
    [
        "NVIDIA-L40S-MIG-1g.12gb",
        "NVIDIA-A100-SXM4-80GB-MIG-8g.80gb",
        "NVIDIA-A100-SXM4-80GB-MIG-3g.120gb",
        "NVIDIA-A100-SXM4-80GB-MIG-4c.3g.40gb",
    ],
)
def test_impossible_mig_profile_is_an_input_error(label):
    with pytest.raises(InputError, match="^gpu_model: .*no MIG profile"):
        get_gpu(label)


def test_cuda_memory_is_sourced_and_below_nvidia_smis_total():
    """What CUDA gives a process (torch's 'total capacity') is at most nvidia-smi's total and within the
    few per cent the driver keeps; each figure names its public source."""
    sourced = [g for g in load_gpus().values() if g.cuda_memory_mib is not None]
    assert len(sourced) >= 15
    for g in sourced:
        assert 0.97 * g.memory_mib <= g.cuda_memory_mib <= g.memory_mib, g.name
        assert any("total" in s and ("capacity" in s or "CUDA" in s) for s in g.source), g.name
    assert get_gpu("H100").cuda_memory_mib == pytest.approx(79.11 * 1024)


def test_gpus_without_a_source_lose_the_median_driver_reserve():
    import statistics

    from tunebench.catalog.gpus import driver_reserve

    # distinct logs that show a reserve (an old driver's CUDA total equal to nvidia-smi's says nothing)
    pairs = {(g.memory_mib, g.cuda_memory_mib) for g in load_gpus().values() if g.cuda_memory_mib}
    shares = [1 - cuda / smi for smi, cuda in pairs if 1 - cuda / smi >= 0.001]
    assert len(shares) < len(pairs)  # V100 / MI300X / A10G logs keep nothing back and are left out
    assert driver_reserve() == pytest.approx(statistics.median(shares))
    a6000 = get_gpu("NVIDIA-RTX-A6000")  # no public log ties torch's figure to it
    assert a6000.cuda_memory_mib is None
    assert a6000.cuda_memory_bytes == pytest.approx(a6000.memory_bytes * (1 - statistics.median(shares)))
    assert 0.005 < driver_reserve() < 0.02


@pytest.mark.parametrize(
    "value, chosen, also",
    [("A100", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB"), ("H100", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL")],
)
def test_an_alias_that_names_parts_of_other_memory_sizes_is_noted(value, chosen, also):
    from tunebench.catalog.gpus import alias_note

    note = alias_note(value)
    assert f"{value} is taken as {chosen}" in note and also in note
    # labels, aliases that name their memory, and GPUs whose only siblings share it are not noted
    for plain in (chosen, "A100-40GB", "A100-80GB", "L40", "L4", "H200", "unknown-gpu", None):
        assert alias_note(plain) is None
