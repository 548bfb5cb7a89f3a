// A reference for nodecheck's h2d/d2h figures that involves no PyTorch: cudaMemcpyAsync of 1 GiB of
// pinned host memory on one stream, 10 copies timed with CUDA events after 3 warm-ups (what
// nvbandwidth's host_to_device_memcpy_ce does with its copy engine). Prints "h2d <GB/s>" and "d2h <GB/s>".
// Build: nvcc -O2 -o h2d_reference h2d_reference.cu ; run: ./h2d_reference [device]
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call) do { cudaError_t e = (call); if (e != cudaSuccess) { \
    fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e)); return 1; } } while (0)

int main(int argc, char **argv) {
    const size_t bytes = size_t(1) << 30;
    const int warmup = 3, copies = 10;
    CHECK(cudaSetDevice(argc > 1 ? atoi(argv[1]) : 0));
    void *host, *dev;
    CHECK(cudaMallocHost(&host, bytes));
    CHECK(cudaMalloc(&dev, bytes));
    cudaStream_t stream;
    cudaEvent_t start, stop;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    const char *names[2] = {"h2d", "d2h"};
    for (int d = 0; d < 2; d++) {
        void *dst = d == 0 ? dev : host, *src = d == 0 ? host : dev;
        cudaMemcpyKind kind = d == 0 ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
        for (int i = 0; i < warmup; i++) CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
        CHECK(cudaEventRecord(start, stream));
        for (int i = 0; i < copies; i++) CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream));
        CHECK(cudaEventRecord(stop, stream));
        CHECK(cudaEventSynchronize(stop));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, start, stop));
        printf("%s %.3f\n", names[d], copies * (double)bytes / (ms / 1e3) / 1e9);
    }
    return 0;
}
