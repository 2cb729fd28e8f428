// Driver of tests/cuda_host.rs (appended after shim.h and the CUDA headers).
//   check decode TYPE N_IN ROWS IN OUT   rows of stored bytes -> f32 via
//                                         decode32 (whole units) and decode1
//   check round IN OUT                    f32 -> 5 f32 per value: round_e4m3,
//                                         round_e2m1, round_f16,
//                                         pow2_scale(|v|, 448), pow2_scale(|v|, 6)

static std::vector<unsigned char> slurp(const char* p) {
    FILE* f = std::fopen(p, "rb");
    if (!f) { std::perror(p); std::exit(2); }
    std::vector<unsigned char> v;
    unsigned char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    std::fclose(f);
    return v;
}

static void spit(const char* p, const std::vector<float>& v) {
    FILE* f = std::fopen(p, "wb");
    if (!f) { std::perror(p); std::exit(2); }
    std::fwrite(v.data(), 4, v.size(), f);
    std::fclose(f);
}

template <int TY>
static void decode_rows(const std::vector<unsigned char>& in, unsigned n_in, unsigned rows, std::vector<float>& out) {
    const size_t rb = in.size() / rows;
    out.assign((size_t)2 * rows * n_in, 0.0f);
    for (unsigned r = 0; r < rows; r++) {
        const u8* row = in.data() + r * rb;
        float* a = out.data() + (size_t)r * n_in;
        float* b = out.data() + (size_t)(rows + r) * n_in;
        if (n_in % 32 == 0) {
            for (unsigned u = 0; u < n_in / 32; u++) decode32<TY>(row, u, a + 32 * u);
        } else {
            for (unsigned i = 0; i < n_in; i++) a[i] = decode1<TY>(row, i);
        }
        for (unsigned i = 0; i < n_in; i++) b[i] = decode1<TY>(row, i);
    }
}

int main(int argc, char** argv) {
    if (argc == 7 && !std::strcmp(argv[1], "decode")) {
        const int ty = std::atoi(argv[2]);
        const unsigned n_in = std::atoi(argv[3]), rows = std::atoi(argv[4]);
        // Copied into 16-byte aligned storage, as on the device.
        std::vector<unsigned char> raw = slurp(argv[5]);
        std::vector<float4> store(raw.size() / 16 + 1);
        std::memcpy(store.data(), raw.data(), raw.size());
        std::vector<unsigned char> in((unsigned char*)store.data(), (unsigned char*)store.data() + raw.size());
        std::vector<float> out;
        switch (ty) {
#define CASE(name, TY) case TY: decode_rows<TY>(in, n_in, rows, out); break;
            FOR_EACH_WEIGHT_TYPE(CASE)
            default: std::fprintf(stderr, "type %d\n", ty); return 2;
        }
        spit(argv[6], out);
        return 0;
    }
    if (argc == 4 && !std::strcmp(argv[1], "round")) {
        std::vector<unsigned char> raw = slurp(argv[2]);
        std::vector<float> v(raw.size() / 4), out;
        std::memcpy(v.data(), raw.data(), raw.size());
        for (float x : v) {
            out.push_back(round_e4m3(x));
            out.push_back(round_e2m1(x));
            out.push_back(round_f16(x));
            out.push_back(pow2_scale(std::fabs(x), 448.0f));
            out.push_back(pow2_scale(std::fabs(x), 6.0f));
        }
        spit(argv[3], out);
        return 0;
    }
    std::fprintf(stderr, "usage: check decode TYPE N_IN ROWS IN OUT | check round IN OUT\n");
    return 2;
}
