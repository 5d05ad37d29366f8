// The baseline for the selective scan (Mamba-1) bench rows: mamba-ssm's own CUDA kernels
// (`csrc/selective_scan/selective_scan_{fwd,bwd}_kernel.cuh` of the mamba-ssm 2.3.1 sdist, which
// `scripts/fetch-baselines.sh` unpacks), launched alone, without PyTorch's extension machinery,
// at the bench's shape: bf16 u, delta, z, B, C; f32 A and D; delta softplus; one group.
// Built and run on the GPU machine by `scripts/mamba-selective-scan.sh`; prints two lines,
// `mamba_selective_scan_fwd <batch>x<dim>x<len> N<n> <ms>` and `mamba_selective_scan_bwd …`,
// each the median of 20 timed calls after 5 warm-up ones (CUDA events). The backward is what
// mamba's `selective_scan_bwd` does on the GPU given the forward's saved chunk states: the
// zeroed f32 dA, dB, dC, dD and the kernel (the one instantiation this shape takes, launched as
// its dispatcher does; the dispatcher's 160 instantiations take many minutes of nvcc), without
// the dB, dC casts back to bf16 torch adds. This is a peer's kernel for comparison, not a
// Tessera kernel.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
#include "selective_scan_fwd_kernel.cuh"
#include "selective_scan_bwd_kernel.cuh"

template void selective_scan_fwd_cuda<at::BFloat16, float>(SSMParamsBase &params, cudaStream_t stream);

#define CHECK(x)                                                                 \
    do {                                                                         \
        cudaError_t e = (x);                                                     \
        if (e != cudaSuccess) {                                                  \
            std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e));         \
            std::exit(1);                                                        \
        }                                                                        \
    } while (0)

static void *device_fill(size_t n, size_t elem, bool bf16, float lo, float hi, unsigned seed) {
    std::vector<unsigned char> host(n * elem);
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        float v = lo + (hi - lo) * (float)rand() / (float)RAND_MAX;
        if (bf16) {
            at::BFloat16 b(v);
            std::memcpy(&host[i * elem], &b, 2);
        } else {
            std::memcpy(&host[i * elem], &v, 4);
        }
    }
    void *d;
    CHECK(cudaMalloc(&d, n * elem));
    CHECK(cudaMemcpy(d, host.data(), n * elem, cudaMemcpyHostToDevice));
    return d;
}

// The median of 20 timed calls of `f` after 5 warm-up ones, in ms.
template <typename F> static float median_ms(F f) {
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++) f();
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < 20; i++) {
        CHECK(cudaEventRecord(a));
        f();
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CHECK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

int main(int argc, char **argv) {
    int batch = argc > 1 ? atoi(argv[1]) : 8, dim = argc > 2 ? atoi(argv[2]) : 1536;
    int seqlen = argc > 3 ? atoi(argv[3]) : 4096, dstate = argc > 4 ? atoi(argv[4]) : 16;
    size_t bdl = (size_t)batch * dim * seqlen, bnl = (size_t)batch * dstate * seqlen;
    int n_chunks = (seqlen + 2047) / 2048;
    SSMParamsBase p;
    std::memset(&p, 0, sizeof(p));
    p.batch = batch, p.dim = dim, p.seqlen = seqlen, p.dstate = dstate, p.n_groups = 1, p.n_chunks = n_chunks;
    p.dim_ngroups_ratio = dim, p.is_variable_B = true, p.is_variable_C = true, p.delta_softplus = true;
    p.u_ptr = device_fill(bdl, 2, true, -1, 1, 1);
    p.delta_ptr = device_fill(bdl, 2, true, -1, 1, 2);
    p.z_ptr = device_fill(bdl, 2, true, -1, 1, 3);
    p.B_ptr = device_fill(bnl, 2, true, -1, 1, 4);
    p.C_ptr = device_fill(bnl, 2, true, -1, 1, 5);
    p.A_ptr = device_fill((size_t)dim * dstate, 4, false, -0.5f, -0.5f, 6);
    p.D_ptr = device_fill(dim, 4, false, 1, 1, 7);
    void *out, *out_z, *x;
    CHECK(cudaMalloc(&out, bdl * 2));
    CHECK(cudaMalloc(&out_z, bdl * 2));
    CHECK(cudaMalloc(&x, (size_t)batch * dim * n_chunks * dstate * 2 * 4));
    p.out_ptr = out, p.out_z_ptr = out_z, p.x_ptr = x;
    p.A_d_stride = dstate, p.A_dstate_stride = 1;
    p.B_batch_stride = p.C_batch_stride = dstate * seqlen;
    p.B_group_stride = p.C_group_stride = dstate * seqlen;
    p.B_dstate_stride = p.C_dstate_stride = seqlen;
    p.u_batch_stride = p.delta_batch_stride = p.z_batch_stride = p.out_batch_stride = p.out_z_batch_stride = dim * seqlen;
    p.u_d_stride = p.delta_d_stride = p.z_d_stride = p.out_d_stride = p.out_z_d_stride = seqlen;
    float fwd = median_ms([&] { selective_scan_fwd_cuda<at::BFloat16, float>(p, 0); });
    std::printf("mamba_selective_scan_fwd %dx%dx%d N%d %.4f\n", batch, dim, seqlen, dstate, fwd);

    // The backward, from the forward's outputs (`out`, the chunk states `x`).
    SSMParamsBwd q;
    std::memset(&q, 0, sizeof(q));
    static_cast<SSMParamsBase &>(q) = p;
    q.dout_ptr = device_fill(bdl, 2, true, -1, 1, 8);
    void *du, *ddelta, *dz, *dA, *dB, *dC, *dD;
    CHECK(cudaMalloc(&du, bdl * 2));
    CHECK(cudaMalloc(&ddelta, bdl * 2));
    CHECK(cudaMalloc(&dz, bdl * 2));
    size_t da_bytes = (size_t)dim * dstate * 4, dbc_bytes = bnl * 4;
    CHECK(cudaMalloc(&dA, da_bytes));
    CHECK(cudaMalloc(&dB, dbc_bytes));
    CHECK(cudaMalloc(&dC, dbc_bytes));
    CHECK(cudaMalloc(&dD, dim * 4));
    q.du_ptr = du, q.ddelta_ptr = ddelta, q.dz_ptr = dz, q.dA_ptr = dA, q.dB_ptr = dB, q.dC_ptr = dC, q.dD_ptr = dD;
    q.dout_batch_stride = q.du_batch_stride = q.ddelta_batch_stride = q.dz_batch_stride = dim * seqlen;
    q.dout_d_stride = q.du_d_stride = q.ddelta_d_stride = q.dz_d_stride = seqlen;
    q.dA_d_stride = dstate, q.dA_dstate_stride = 1;
    q.dB_batch_stride = q.dC_batch_stride = dstate * seqlen;
    q.dB_group_stride = q.dC_group_stride = dstate * seqlen;
    q.dB_dstate_stride = q.dC_dstate_stride = seqlen;
    if (seqlen <= 1024 || seqlen % 2048 != 0) {
        std::fprintf(stderr, "the backward baseline is built for lengths a multiple of 2048\n");
        return 1;
    }
    // selective_scan_bwd_cuda's choice for seqlen > 1024 and this call's flags.
    using K = Selective_Scan_bwd_kernel_traits<128, 16, true, true, true, true, true, at::BFloat16, float>;
    constexpr int smem = K::kSmemSize + MAX_DSTATE * sizeof(K::scan_t) + (K::kNThreads + 4 * MAX_DSTATE) * sizeof(K::weight_t);
    auto kernel = &selective_scan_bwd_kernel<K>;
    if (smem >= 48 * 1024) CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    float bwd = median_ms([&] {
        cudaMemsetAsync(dA, 0, da_bytes, 0);
        cudaMemsetAsync(dB, 0, dbc_bytes, 0);
        cudaMemsetAsync(dC, 0, dbc_bytes, 0);
        cudaMemsetAsync(dD, 0, dim * 4, 0);
        kernel<<<dim3(batch, dim), K::kNThreads, smem, 0>>>(q);
    });
    CHECK(cudaGetLastError());
    std::printf("mamba_selective_scan_bwd %dx%dx%d N%d %.4f\n", batch, dim, seqlen, dstate, bwd);
    return 0;
}
