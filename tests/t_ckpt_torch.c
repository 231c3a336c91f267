/*
 * The checkpoint's safetensors files load in PyTorch (Debian's python3-torch; skipped when absent):
 * a Python reader of the format (8-byte little-endian header length, JSON header, raw data) builds
 * torch tensors with torch.frombuffer and compares them with what strata itself reads back:
 *   model.safetensors     F32 master weights == strata_param_read_master, bit for bit
 *   params.safetensors    the BF16 pending copy "<name>.next" == torch's own bf16 rounding of the master
 *   optimizer.safetensors exp_avg_sq >= 0 everywhere, shapes match the master
 */
#include <stdio.h>
#include <stdlib.h>

#include "synth.h"
#include "testlib.h"

static const char *script =
    "import json, struct, sys\n"
    "import torch\n"
    "d, layers = sys.argv[1], int(sys.argv[2])\n"
    "def load(name):\n"
    "    raw = open(d + '/' + name, 'rb').read()\n"
    "    n = struct.unpack('<Q', raw[:8])[0]\n"
    "    head = json.loads(raw[8:8 + n])\n"
    "    dt = {'F32': torch.float32, 'BF16': torch.bfloat16, 'F16': torch.float16}\n"
    "    out = {}\n"
    "    for k, v in head.items():\n"
    "        if k == '__metadata__':\n"
    "            continue\n"
    "        b, e = v['data_offsets']\n"
    "        t = torch.frombuffer(bytearray(raw[8 + n + b:8 + n + e]), dtype=dt[v['dtype']])\n"
    "        out[k] = t.reshape(v['shape'])\n"
    "    return out\n"
    "model, opt, par = load('model.safetensors'), load('optimizer.safetensors'), load('params.safetensors')\n"
    "expected = torch.frombuffer(bytearray(open(d + '/expected.bin', 'rb').read()), dtype=torch.float32)\n"
    "pos, bad = 0, []\n"
    "for l in range(layers):\n"
    "    for p in ('weight', 'bias'):\n"
    "        k = 'layer%d.%s' % (l, p)\n"
    "        w = model[k]\n"
    "        ref = expected[pos:pos + w.numel()]\n"
    "        pos += w.numel()\n"
    "        if not torch.equal(w.view(torch.int32), ref.view(torch.int32)):\n"
    "            bad.append('%s: master differs from strata_param_read_master' % k)\n"
    "        if not torch.equal(par[k + '.next'], w.to(torch.bfloat16)):\n"
    "            bad.append('%s.next: bf16 copy differs from torch rounding of the master' % k)\n"
    "        if opt[k + '.exp_avg'].shape != w.shape or bool((opt[k + '.exp_avg_sq'] < 0).any()):\n"
    "            bad.append('%s: moments wrong' % k)\n"
    "print('torch %s: %d master tensors, %d optimizer, %d params; %s' % (torch.__version__, len(model), len(opt),\n"
    "      len(par), 'ok' if not bad and pos == expected.numel() else 'MISMATCH'))\n"
    "for b in bad:\n"
    "    print(b)\n"
    "sys.exit(1 if bad or pos != expected.numel() else 0)\n";

int main(void)
{
    t_rng_seed();
    if (system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0)
        t_skip("/usr/bin/python3 cannot import torch (install Debian's python3-torch)");
    const char *scratch = t_scratch_dir("t_ckpt_torch");
    char dir[600], path[700], cmd[1600];
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    strata_config c = synth_config(STRATA_DTYPE_BF16);
    c.offload_optimizer.device = STRATA_TIER_HOST;
    c.delayed_update = true; /* saved with an update pending: params.safetensors holds "<name>.next" */
    c.delayed_warmup_steps = 1;
    synth_opts o;
    synth_defaults(&o, t_rand_u64());
    o.steps = o.save_after = 3;
    o.save_dir = dir;
    float *w = NULL;
    size_t n = 0;
    T_OK(synth_train(&o, &c, &w, &n, NULL, NULL));
    if (!w)
        return t_done();
    snprintf(path, sizeof path, "%s/expected.bin", dir);
    FILE *f = fopen(path, "wb");
    T_CHECK(f && fwrite(w, 4, n, f) == n, "cannot write %s", path);
    fclose(f);
    free(w);
    snprintf(path, sizeof path, "%s/read.py", scratch);
    f = fopen(path, "w");
    fputs(script, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s %d", path, dir, o.layers);
    int rc = system(cmd);
    T_CHECK(rc == 0, "PyTorch disagrees with strata about the checkpoint (%s exited %d)", cmd, rc);
    return t_done();
}
