// The baseline for the selective scan (Mamba-1) forward bench row: mamba-ssm's own CUDA kernel
// (`csrc/selective_scan/selective_scan_fwd_kernel.cuh` of the mamba-ssm 2.3.1 sdist, which
// `scripts/fetch-baselines.sh` unpacks), launched alone, without PyTorch's extension machinery,
// at the bench's shape: bf16 u, delta, z, B, C; f32 A and D; delta softplus; one group.
// Built and run on the GPU machine by `scripts/mamba-selective-scan.sh`; prints one line,
// `mamba_selective_scan_fwd <batch>x<dim>x<len> N<n> <ms>`, the median of 20 timed launches
// after 5 warm-up ones (CUDA events). This is a peer's kernel for comparison, not a Tessera
// kernel.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cstring>
#include "selective_scan_fwd_kernel.cuh"

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
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int i = 0; i < 5; i++) selective_scan_fwd_cuda<at::BFloat16, float>(p, 0);
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < 20; i++) {
        CHECK(cudaEventRecord(a));
        selective_scan_fwd_cuda<at::BFloat16, float>(p, 0);
        CHECK(cudaEventRecord(b));
        CHECK(cudaEventSynchronize(b));
        float t;
        CHECK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("mamba_selective_scan_fwd %dx%dx%d N%d %.4f\n", batch, dim, seqlen, dstate, ms[ms.size() / 2]);
    return 0;
}
