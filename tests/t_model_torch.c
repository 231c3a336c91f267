/*
 * The GPT model against an independent implementation: the loss and every gradient of the C model, driven
 * through a strata engine, compared by benchmarks/gpt_vs_torch.py with PyTorch (float64) on the same weights
 * and batch. Skipped when Debian's python3-torch is not installed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gpt_engine.h"
#include "synth.h"
#include "testlib.h"

static void write_file(const char *dir, const char *name, const void *data, size_t bytes)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    T_CHECK(f && fwrite(data, 1, bytes, f) == bytes, "cannot write %s", path);
    if (f)
        fclose(f);
}

int main(void)
{
    const char *python = "/usr/bin/python3";
    if (system("/usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1") != 0)
        t_skip("%s cannot import torch and numpy (install python3-torch)", python);
    const char *src_dir = getenv("STRATA_SOURCE_DIR");
    if (!src_dir)
        src_dir = ".";

    /* Not the presets: odd sizes (3 heads of 8, seq 12 of a 16 context) catch layout mistakes. */
    gpt_dims d = {.layers = 2, .heads = 3, .hidden = 24, .vocab = 256, .seq = 16};
    enum { B = 2, T = 12 };
    uint64_t seed = t_rand_u64();
    strata_config c;
    strata_config_init(&c);
    c.backend = STRATA_BACKEND_HOST;
    c.device_budget_bytes = 64u << 20;
    c.activation_bytes = gpt_engine_activation_bytes(&d, B, T, 1, GPT_ACT_KEEP, GPT_ACTS_FP32, STRATA_DTYPE_FP32);
    strata_engine *e = NULL;
    gpt_model *m = NULL;
    T_OK(strata_engine_create(&c, &e));
    T_OK(gpt_model_register(e, &d, seed, &m));
    T_OK(strata_engine_finalize(e));
    T_OK(gpt_model_prepare(m, B, T, 1, GPT_ACT_KEEP, STRATA_DTYPE_FP32));

    size_t n = gpt_numel(&d);
    float *w = malloc(n * sizeof(float)), *g = calloc(n, sizeof(float));
    T_OK(gpt_model_read_weights(m, w));
    int32_t tok[B * T], tgt[B * T];
    synth_rand_tokens(tok, tgt, B * T);
    T_OK(gpt_model_capture_grads(m, g));
    double loss = 0;
    T_OK(gpt_model_micro_step(m, tok, tgt, true, 1.0f, &loss));

    const char *dir = t_scratch_dir("model_torch");
    char text[256];
    int len = snprintf(text, sizeof text, "%d %d %d %d %d %d %d\n", d.layers, d.heads, d.hidden, d.vocab, d.seq, B, T);
    write_file(dir, "dims.txt", text, (size_t)len);
    len = snprintf(text, sizeof text, "%.17g\n", loss);
    write_file(dir, "loss.txt", text, (size_t)len);
    write_file(dir, "params.bin", w, n * sizeof(float));
    write_file(dir, "grads.bin", g, n * sizeof(float));
    write_file(dir, "tokens.bin", tok, sizeof tok);
    write_file(dir, "targets.bin", tgt, sizeof tgt);

    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s/benchmarks/gpt_vs_torch.py %s", python, src_dir, dir);
    printf("%s\n", cmd);
    fflush(stdout);
    int rc = system(cmd);
    T_CHECK(rc == 0, "gpt_vs_torch.py found differences (exit status %d); see its table above", rc);

    free(w);
    free(g);
    gpt_model_destroy(m);
    strata_engine_destroy(e);
    t_scratch_cleanup();
    return t_done();
}
