/* `strata ckpt inspect DIR` (summary and a table of tensors with their checksum status),
 * `strata ckpt verify DIR` (every checksum; exit 1 on any damage) and `strata ckpt export DIR --to FILE` (the master
 * weights as one safetensors file, each tensor whole and in its model shape). DIR is a checkpoint or a directory
 * holding them (what `strata train --save DIR` writes), whose latest checkpoint is taken. A checkpoint of N ranks
 * (each rank's files hold pieces of the tensors) lists one row per piece, its element range after the tensor's
 * shape. */
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "base/size.h"
#include "engine/ckpt/ckpt_export.h"
#include "engine/ckpt/ckpt_files.h"
#include "strata.h"
#include "tools/ckpt_locate.h"
#include "tools/cli.h"
#include "tools/options.h"

/* --dtype's choices, in the order the option lists them. */
static const strata_dtype export_dtypes[] = {STRATA_DTYPE_FP32, STRATA_DTYPE_BF16, STRATA_DTYPE_FP16};

typedef struct export_args {
    const char *to;
    int dtype; /* index into export_dtypes, as --dtype's choices are */
} export_args;

static const cli_opt export_opts[] = {
    {.name = "--to", .kind = CLI_TEXT, .offset = offsetof(export_args, to), .meta = "FILE",
     .help = "the file to write (required)"},
    {.name = "--dtype", .kind = CLI_CHOICE, .offset = offsetof(export_args, dtype), .meta = "DTYPE",
     .choices = "fp32|bf16|fp16",
     .help = "fp32 (default: the master weights exactly), bf16 or fp16 (rounded to nearest even)"},
};
static const cli_opt_group export_groups[] = {CLI_GROUP(export_opts)};
static const cli_spec export_spec = {.command = "ckpt export", .groups = export_groups, .ngroups = 1};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: strata ckpt inspect DIR\n"
            "       strata ckpt verify DIR\n"
            "       strata ckpt export DIR --to FILE.safetensors [--dtype fp32|bf16|fp16]\n\n"
            "inspect  print the checkpoint's step, precision, the ranks that wrote it and its files, and one row per\n"
            "         tensor (per piece of a tensor, for a checkpoint of several ranks): name, file, dtype, shape\n"
            "         (and the piece's elements), bytes and whether its crc32c matches the manifest\n"
            "verify   read every piece of every rank's files and check sizes, headers, checksums and that the pieces\n"
            "         of each tensor cover it exactly once; exit 1 when anything is damaged\n"
            "export   write the fp32 master weights as ONE safetensors file that PyTorch loads (DeepSpeed's\n"
            "         zero_to_fp32): every tensor gathered whole from all ranks' pieces, under its name and in the\n"
            "         shape the trainer declared (1-D [numel] where none was recorded, with a note), every piece's\n"
            "         checksum checked; written to a temporary file beside FILE, fsynced, then renamed over it\n");
    cli_print_options(&export_spec, out);
    fprintf(out,
            "\nDIR is a checkpoint, or a directory holding checkpoints (such as `strata train --save DIR` writes:\n"
            "DIR/step-N), of which the latest is taken.\n");
}

static void row(const ckpt_tensor *t, bool ok, uint32_t actual, void *user)
{
    const int *world = user;
    char bytes[32], status[48], shape[64], file[CKPT_FILE_NAME_BYTES];
    snprintf(status, sizeof status, ok ? "ok" : "BAD (crc %08x)", actual);
    if (t->numel == t->total)
        snprintf(shape, sizeof shape, "[%" PRIu64 "]", t->total);
    else
        snprintf(shape, sizeof shape, "[%" PRIu64 "] %" PRIu64 ":%" PRIu64, t->total, t->first, t->first + t->numel);
    ckpt_file_name(*world, t->rank, t->file, file);
    printf("%-48s %-28s %-5s %-22s %12s  %08x  %s\n", t->name, file, ckpt_dtype_name(t->dtype), shape,
           size_format(t->end - t->begin, bytes, sizeof bytes), t->crc, status);
}

/* Tensors (not pieces) of a manifest: each has one piece that starts at its element 0. */
static size_t count_tensors(const ckpt_manifest *m)
{
    size_t n = 0;
    for (size_t i = 0; i < m->ntensors; i++)
        n += m->tensors[i].first == 0;
    return n;
}

static int inspect(const char *dir)
{
    ckpt_manifest m;
    if (ckpt_manifest_read(dir, &m) != STRATA_OK) {
        fprintf(stderr, "strata ckpt inspect: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    char sz[32];
    printf("checkpoint   %s\n", dir);
    printf("format       strata-checkpoint v%d\n", m.version);
    printf("step         %" PRId64 " (%" PRId64 " strata_step calls; %" PRId64 " skipped)\n", m.step, m.iterations,
           m.skipped_steps);
    printf("parameters   %s; loss scale %g\n", ckpt_dtype_name(m.param_dtype), m.loss_scale);
    printf("pending      %s\n", m.pending ? "a delayed update (saved as \"<name>.next\")" : "none");
    printf("world        written by %d rank%s: %zu tensors in %zu pieces\n", m.world, m.world == 1 ? "" : "s",
           count_tensors(&m), m.ntensors);
    for (int r = 0; r < m.world; r++)
        for (int f = 0; f < CKPT_FILE_COUNT; f++) {
            uint64_t bytes = ckpt_manifest_file_bytes(&m, r, f);
            char name[CKPT_FILE_NAME_BYTES];
            ckpt_file_name(m.world, r, f, name);
            if (bytes)
                printf("file         %-28s %s\n", name, size_format(bytes, sz, sizeof sz));
        }
    int world = m.world;
    ckpt_manifest_free(&m);
    printf("\n%-48s %-28s %-5s %-22s %12s  %-8s  %s\n", "TENSOR", "FILE", "DTYPE", "SHAPE", "BYTES", "CRC32C",
           "STATUS");
    size_t bad = 0;
    strata_status st = ckpt_verify(dir, row, &world, &bad);
    if (st != STRATA_OK) {
        fprintf(stderr, "\nstrata ckpt inspect: %zu problem(s); the first: %s\n", bad, strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    return CLI_EXIT_OK;
}

static int verify(const char *dir)
{
    strata_checkpoint_info info;
    ckpt_manifest m = {0};
    size_t bad = 0;
    strata_status st = strata_checkpoint_inspect(dir, &info);
    if (st == STRATA_OK)
        st = ckpt_manifest_read(dir, &m);
    if (st == STRATA_OK)
        st = ckpt_verify(dir, NULL, NULL, &bad);
    size_t tensors = count_tensors(&m);
    ckpt_manifest_free(&m);
    if (st != STRATA_OK) {
        fprintf(stderr, "strata ckpt verify: %s: %s (%zu bad)\n", dir, strata_last_error(NULL), bad);
        return CLI_EXIT_FAIL;
    }
    char sz[32], ranks[64] = "";
    if (info.world_size > 1)
        snprintf(ranks, sizeof ranks, " in %zu pieces from %d ranks", info.tensors, info.world_size);
    printf("%s: ok — step %" PRId64 ", %zu tensors%s, %s, every checksum matches\n", dir, info.step, tensors,
           ranks, size_format(info.bytes, sz, sizeof sz));
    return CLI_EXIT_OK;
}

/* export's options after DIR (argv[3..]): --to FILE, --dtype DTYPE. Returns 0 or an exit code. */
static int export_options(int argc, char **argv, const char **to, strata_dtype *dtype)
{
    export_args args = {0};
    /* The parser reads from its argv[1]: DIR stands where a command's name would. */
    int rc = cli_parse_or_say(&export_spec, argc - 2, argv + 2, &args);
    if (rc != CLI_EXIT_OK)
        return rc;
    if (!args.to || !*args.to) {
        fprintf(stderr, "strata ckpt export: --to FILE.safetensors is required: the file to write\n");
        return CLI_EXIT_USAGE;
    }
    *to = args.to;
    *dtype = export_dtypes[args.dtype];
    return CLI_EXIT_OK;
}

static int export(const char *dir, const char *to, strata_dtype dtype)
{
    ckpt_export_report rep;
    if (ckpt_export(dir, to, dtype, &rep) != STRATA_OK) {
        fprintf(stderr, "strata ckpt export: %s\n", strata_last_error(NULL));
        return CLI_EXIT_FAIL;
    }
    char sz[32];
    printf("%s: exported %zu tensors of step %" PRId64 " (gathered from %d rank%s) to %s as %s, %s\n", dir,
           rep.tensors, rep.step, rep.world, rep.world == 1 ? "" : "s", to, ckpt_dtype_name(dtype),
           size_format(rep.file_bytes, sz, sizeof sz));
    if (rep.flat)
        printf("note: %zu of %zu tensors (\"%s\"%s) have no recorded shape and are written flat [numel]; a trainer "
               "declares shapes with strata_param_set_shape (Python: Engine.set_param_shape)\n", rep.flat,
               rep.tensors, rep.first_flat, rep.flat > 1 ? " and others" : "");
    return CLI_EXIT_OK;
}

int cmd_ckpt(int argc, char **argv)
{
    if (cli_wants_help(argc, argv)) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    bool is_export = argc >= 3 && strcmp(argv[1], "export") == 0;
    if (!is_export && (argc != 3 || (strcmp(argv[1], "inspect") != 0 && strcmp(argv[1], "verify") != 0))) {
        static const cli_subcommand subs[] = {
            {"inspect", "one DIR, a checkpoint or a directory holding checkpoints"},
            {"verify", "one DIR, a checkpoint or a directory holding checkpoints"},
            {"export", "DIR --to FILE.safetensors [--dtype fp32|bf16|fp16]"},
            {NULL, NULL}};
        cli_subcommand_error("ckpt", argc, argv, subs);
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *to = NULL;
    strata_dtype dtype = STRATA_DTYPE_FP32;
    int rc = is_export ? export_options(argc, argv, &to, &dtype) : CLI_EXIT_OK;
    if (rc != CLI_EXIT_OK)
        return rc;
    char buf[PATH_MAX];
    const char *dir = ckpt_locate(argv[2], buf, sizeof buf);
    if (!dir) {
        fprintf(stderr, "strata ckpt %s: %s; %s\n", argv[1], strata_last_error(NULL), CKPT_LOCATE_EXPECTED);
        return CLI_EXIT_FAIL;
    }
    if (dir != argv[2])
        printf("%s: latest checkpoint: %s\n", argv[2], dir);
    if (is_export)
        return export(dir, to, dtype);
    return strcmp(argv[1], "inspect") == 0 ? inspect(dir) : verify(dir);
}
