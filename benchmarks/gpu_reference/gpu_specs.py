"""Vendor peak numbers for the GPUs that appear in measurements.csv.

Dense (non-sparse) peaks. Where NVIDIA datasheets quote tensor-core numbers "with sparsity"
(Ampere/Hopper/Ada), the dense value is half of that figure. peak_float32 is the non-tensor
FP32 (FFMA) peak. TF32 exists only from Ampere on; FP16 is the tensor-core FP16 peak
(FP32 accumulate) where the GPU has tensor cores, the native half2 rate for P100, and blank
where FP16 runs at a crippled rate (GP102/GP104 consumer & P4 parts: 1/64) or is absent
(Maxwell). Memory sizes are in bytes using 2**30 per vendor "GB" (HBM/GDDR capacities are
binary). L2 sizes as given by NVIDIA whitepapers (MB = 2**20 bytes).
Boost clock: NVIDIA's rated boost clock (GeForce/Titan cards routinely run above it).
"""

GiB = 2 ** 30
MiB = 2 ** 20

GPU_SPECS = [
    dict(id="h100", name="NVIDIA H100 SXM5 80GB (HBM3)", sm_count=132, boost_clock_hz=1.98e9,
         peak_float32_flops_per_s=66.9e12, peak_tf32_flops_per_s=494.7e12, peak_float16_flops_per_s=989.4e12,
         memory_bandwidth_bytes_per_s=3.35e12, l2_bytes=50 * MiB, memory_bytes=80 * GiB,
         spec_source="https://www.nvidia.com/en-us/data-center/h100/ (datasheet: FP32 67 TF, TF32 989 TF sparse, FP16 1979 TF sparse, 3.35 TB/s); "
                     "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper (132 SMs, 50 MB L2)"),
    # measured by tbs itself (source tbs: profiles/h200, tbs/predictions/reference/measured.csv); compute as the H100 SXM's
    dict(id="h200", name="NVIDIA H200 SXM 141GB (HBM3e)", sm_count=132, boost_clock_hz=1.98e9,
         peak_float32_flops_per_s=66.9e12, peak_tf32_flops_per_s=494.7e12, peak_float16_flops_per_s=989.4e12,
         memory_bandwidth_bytes_per_s=4.8e12, l2_bytes=50 * MiB, memory_bytes=141 * 10 ** 9,
         spec_source="https://www.nvidia.com/en-us/data-center/h200/ (141 GB HBM3e, 4.8 TB/s; compute as the H100 SXM's); "
                     "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper (132 SMs, 50 MB L2). "
                     "Measured by tbs itself (source tbs: profiles/h200)"),
    dict(id="a100-40gb-pcie", name="NVIDIA A100 PCIe 40GB", sm_count=108, boost_clock_hz=1.41e9,
         peak_float32_flops_per_s=19.5e12, peak_tf32_flops_per_s=156e12, peak_float16_flops_per_s=312e12,
         memory_bandwidth_bytes_per_s=1.555e12, l2_bytes=40 * MiB, memory_bytes=40 * GiB,
         spec_source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
                     "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"),
    dict(id="a100-80gb-pcie", name="NVIDIA A100 PCIe 80GB", sm_count=108, boost_clock_hz=1.41e9,
         peak_float32_flops_per_s=19.5e12, peak_tf32_flops_per_s=156e12, peak_float16_flops_per_s=312e12,
         memory_bandwidth_bytes_per_s=1.935e12, l2_bytes=40 * MiB, memory_bytes=80 * GiB,
         spec_source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
                     "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"),
    dict(id="l4", name="NVIDIA L4 24GB", sm_count=58, boost_clock_hz=2.04e9,
         peak_float32_flops_per_s=30.3e12, peak_tf32_flops_per_s=60e12, peak_float16_flops_per_s=121e12,
         memory_bandwidth_bytes_per_s=300e9, l2_bytes=48 * MiB, memory_bytes=24 * GiB,
         spec_source="https://www.nvidia.com/en-us/data-center/l4/ (datasheet: FP32 30.3 TF, TF32 120 TF sparse, FP16 242 TF sparse, 300 GB/s); "
                     "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf (58 SMs, 48 MB L2)"),
    dict(id="t4", name="NVIDIA Tesla T4 16GB", sm_count=40, boost_clock_hz=1.59e9,
         peak_float32_flops_per_s=8.1e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s=65e12,
         memory_bandwidth_bytes_per_s=320e9, l2_bytes=4 * MiB, memory_bytes=16 * GiB,
         spec_source="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf; "
                     "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"),
    dict(id="v100-pcie", name="NVIDIA Tesla V100 PCIe 32GB", sm_count=80, boost_clock_hz=1.38e9,
         peak_float32_flops_per_s=14e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s=112e12,
         memory_bandwidth_bytes_per_s=900e9, l2_bytes=6 * MiB, memory_bytes=32 * GiB,
         spec_source="https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf; "
                     "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"),
    dict(id="v100", name="NVIDIA Tesla V100 SXM2 (DGX-1; 16 or 32 GB not stated)", sm_count=80, boost_clock_hz=1.53e9,
         peak_float32_flops_per_s=15.7e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s=125e12,
         memory_bandwidth_bytes_per_s=900e9, l2_bytes=6 * MiB, memory_bytes="",
         spec_source="https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf; "
                     "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"),
    dict(id="p100-pcie", name="NVIDIA Tesla P100 PCIe 16GB", sm_count=56, boost_clock_hz=1.303e9,
         peak_float32_flops_per_s=9.3e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s=18.7e12,
         memory_bandwidth_bytes_per_s=732e9, l2_bytes=4 * MiB, memory_bytes=16 * GiB,
         spec_source="https://images.nvidia.com/content/tesla/pdf/nvidia-tesla-p100-PCIe-datasheet.pdf; "
                     "https://images.nvidia.com/content/pdf/tesla/whitepaper/pascal-architecture-whitepaper.pdf "
                     "(FP16 = native half2 rate, no tensor cores; 12GB PCIe variant has 549 GB/s; GP100 SM: 64 FP32 cores, "
                     "GP104/GP102 SM: 128)"),
    dict(id="p4", name="NVIDIA Tesla P4 8GB", sm_count=20, boost_clock_hz=1.063e9,
         peak_float32_flops_per_s=5.5e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=192e9, l2_bytes=2 * MiB, memory_bytes=8 * GiB,
         spec_source="https://images.nvidia.com/content/pdf/tesla/184457-Tesla-P4-Datasheet-NV-Final-Letter-Web.pdf (GP104; FP16 not a datasheet figure)"),
    dict(id="titanxp", name="NVIDIA TITAN Xp 12GB", sm_count=30, boost_clock_hz=1.582e9,
         peak_float32_flops_per_s=12.15e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=547.7e9, l2_bytes=3 * MiB, memory_bytes=12 * GiB,
         spec_source="https://www.nvidia.com/en-us/titan/titan-xp/ (3840 CUDA cores x 2 x 1582 MHz; 11.4 Gbps x 384-bit)"),
    dict(id="titanx-pascal", name="NVIDIA TITAN X (Pascal) 12GB", sm_count=28, boost_clock_hz=1.531e9,
         peak_float32_flops_per_s=10.97e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=480e9, l2_bytes=3 * MiB, memory_bytes=12 * GiB,
         spec_source="https://www.nvidia.com/en-us/geforce/products/10series/titan-x-pascal/ (3584 CUDA cores x 2 x 1531 MHz; 10 Gbps x 384-bit)"),
    dict(id="gtx1080ti", name="NVIDIA GeForce GTX 1080 Ti 11GB", sm_count=28, boost_clock_hz=1.582e9,
         peak_float32_flops_per_s=11.34e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=484e9, l2_bytes=2816 * 1024, memory_bytes=11 * GiB,
         spec_source="https://www.nvidia.com/en-gb/geforce/products/10series/geforce-gtx-1080-ti/ (3584 CUDA cores x 2 x 1582 MHz rated boost; 11 Gbps x 352-bit)"),
    dict(id="m40", name="NVIDIA Tesla M40 (12 or 24 GB not stated)", sm_count=24, boost_clock_hz=1.114e9,
         peak_float32_flops_per_s=7.0e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=288e9, l2_bytes=3 * MiB, memory_bytes="",
         spec_source="https://images.nvidia.com/content/tesla/pdf/tesla-m40-product-brief.pdf (3072 cores, 7 TFLOPS FP32 peak, 288 GB/s)"),
    dict(id="titanx-maxwell", name="NVIDIA GeForce GTX TITAN X (Maxwell) 12GB", sm_count=24, boost_clock_hz=1.075e9,
         peak_float32_flops_per_s=6.6e12, peak_tf32_flops_per_s="", peak_float16_flops_per_s="",
         memory_bandwidth_bytes_per_s=336.5e9, l2_bytes=3 * MiB, memory_bytes=12 * GiB,
         spec_source="https://www.geforce.com/hardware/desktop-gpus/geforce-gtx-titan-x/specifications (3072 cores x 2 x 1075 MHz; 7 Gbps x 384-bit)"),
]

# Base clocks: NVIDIA's datasheets quote the boost clock only; these are the TechPowerUp GPU database's
# (https://www.techpowerup.com/gpu-specs/). A low-power part (T4 70 W, L4 72 W, P4 75 W) sustains far
# less than its boost clock in a long GEMM: the GPU model places its sustained clock between the two.
BASE_CLOCKS_HZ = {
    "h100": 1.590e9, "h200": 1.590e9, "a100-40gb-pcie": 0.765e9, "a100-80gb-pcie": 1.065e9, "l4": 0.795e9, "t4": 0.585e9,
    "v100-pcie": 1.230e9, "v100": 1.290e9, "p100-pcie": 1.126e9, "p4": 0.810e9, "titanxp": 1.405e9,
    "titanx-pascal": 1.417e9, "gtx1080ti": 1.480e9, "m40": 0.948e9, "titanx-maxwell": 1.000e9,
}
# A family shares an SM design: GP100's SM has 64 FP32 cores and twice the registers per core of GP102/GP104's
# 128-core SM (Pascal whitepaper), so the P100 runs SGEMM nearer its peak than the other Pascal parts: its own family.
ARCHITECTURES = {
    "h100": "hopper", "h200": "hopper", "a100-40gb-pcie": "ampere", "a100-80gb-pcie": "ampere", "l4": "ada", "t4": "turing",
    "v100-pcie": "volta", "v100": "volta", "p100-pcie": "pascal-gp100", "p4": "pascal", "titanxp": "pascal",
    "titanx-pascal": "pascal", "gtx1080ti": "pascal", "m40": "maxwell", "titanx-maxwell": "maxwell",
}
for _spec in GPU_SPECS:
    _spec["base_clock_hz"] = BASE_CLOCKS_HZ.get(_spec["id"], "")
    _spec["architecture"] = ARCHITECTURES.get(_spec["id"], "")
