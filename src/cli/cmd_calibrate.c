/* `loom sim calibrate -o PROFILE.txtpb [--device cuda]`: under mpirun,
 * measures this machine's devices (CPU ranks, or one GPU a rank) into a
 * cluster profile (src/sim/calibrate.h) that `loom sim --cluster
 * PROFILE.txtpb` then predicts with. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "backend/cpu/cpu_peak.h"
#include "cli/device.h"
#include "cli/flag_defs.h"
#include "cli/commands.h"
#include "cli/launch.h"
#include "cli/sim_cli.h"
#include "core/decimal.h"
#include "core/log.h"
#include "core/write_file.h"
#include "plan/textformat.h"
#include "sim/calibrate.h"

enum { CALIBRATE_FLAGS = 9, MAX_DIMS = 6 };

/* The GEMM grid's sizes and the largest collective (MiB) by default: a CPU's (and the emulated GPU's, which runs on
 * it) small enough for seconds, a GPU's as large as a layer's. */
static const char CPU_DIMS[] = "64,256,1024", GPU_DIMS[] = "1024,4096,8192";
enum { CPU_MAX_MB = 16, GPU_MAX_MB = 1024 };

int loom_cmd_sim_calibrate(int argc, char **argv) {
  const char *out = NULL, *links = NULL, *name = "calibrated", *device = "cpu", *dims_text = NULL;
  float seconds = 0.2f, mem_mb = 192.0f, max_mb = 0.0f;
  int threads = 0;
  loom_flag table[CALIBRATE_FLAGS] = {
      loom_flag_def_as("-o", &out, "the profile to write (.txtpb) (required)"),
      loom_flag_def_as("--device", &device, "what to measure: cpu (each rank with its threads) or cuda (each rank's GPU)"),
      loom_flag_def("--seconds", &seconds),
      loom_flag_def("--mem-mb", &mem_mb),
      {"--gemm-dims", FLAG_STRING, &dims_text, "the GEMM grid's rising sizes, every m x n x k of them and a cube of twice "
       "the largest; unset: by the device (cpu 64,256,1024; cuda 1024,4096,8192)", LOOM_NO_RANGE, NULL, false, NULL},
      {"--max-mb", FLAG_FLOAT, &max_mb, "the largest collective measured, MiB, from 64 KiB by fours; 0: by the device (cpu 16, "
       "cuda 1024)", 0, 65536, NULL, false, NULL},
      {"--links-from", FLAG_STRING, &links, "a profile whose links a one-rank calibration takes (one rank measures none)", LOOM_NO_RANGE, NULL, false, NULL},
      loom_flag_def_as("--name", &name, "the profile's name"),
      loom_flag_def("--threads", &threads),
  };
  loom_error err = {0};
  bool help;
  int npos;
  loom_status st = loom_cli_parse("loom sim calibrate", "mpirun -np N loom sim calibrate -o PROFILE.txtpb [flags]", table,
                                  CALIBRATE_FLAGS, argc, argv, NULL, 0, &npos, &help, &err);
  if (st != LOOM_OK || help) return loom_report(st, &err);
  if (!out) return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: -o PROFILE.txtpb is required"), &err);
  if (max_mb > 0.0f && max_mb < 0.25f) /* a curve takes two sizes at least: 64 and 256 KiB */
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: --max-mb %g: at least 0.25 (two message sizes, "
                                 "64 and 256 KiB), or 0 for the device's default", max_mb), &err);
  if (strcmp(device, "cpu") != 0 && strcmp(device, "cuda") != 0)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: --device %s: it measures cpu or cuda", device), &err);
  const loom_ops *ops;
  char desc[256];
  if ((st = loom_device_setup("loom sim calibrate", device, &ops, desc, sizeof desc, &err)) != LOOM_OK) return loom_report(st, &err);
  loom_device_facts facts;
  loom_device_facts_of(ops, &facts);
  const bool small = !facts.gpu || facts.emulated;
  int dims[MAX_DIMS];
  const char *dims_list = dims_text ? dims_text : small ? CPU_DIMS : GPU_DIMS;
  const int n_dims = loom_parse_rising_list(dims_list, 1, 1 << 16, dims, MAX_DIMS);
  if (n_dims < 0)
    return loom_report(loom_fail(&err, LOOM_ERR_USAGE, "loom sim calibrate: --gemm-dims %s: expected 1 to %d rising sizes "
                                 "from 1 to 65536, like 64,256,1024", dims_list, MAX_DIMS), &err);
  loom_profile *from = NULL;
  if (links && (st = loom_profile_load(links, &from, &err)) != LOOM_OK) return loom_report(st, &err);
  loom_cpu_set_threads(threads ? threads : loom_launch_default_threads());
  loom_launch launch;
  if ((st = loom_launch_init(&launch, &err)) != LOOM_OK) {
    const int code = loom_report(st, &err);
    loom_launch_finish(&launch);
    return code;
  }
  char world_desc[256];
  loom_comm *world = launch.world ? loom_device_world(launch.world, ops, world_desc, sizeof world_desc) : NULL;
  const loom_calibrate_options o = {.seconds = seconds, .mem_bytes = (size_t)((double)mem_mb * 1048576.0),
                                    .links_from = from, .name = name, .gpu = facts.gpu,
                                    .device_name = facts.gpu ? facts.name : NULL, .memory_bytes = facts.memory_bytes,
                                    .peak_bf16_tflops = facts.peak_bf16_tflops, .fp8 = facts.fp8, .set_tf32 = facts.set_tf32,
                                    .dims = dims, .n_dims = n_dims,
                                    .max_bytes = (max_mb > 0.0f ? max_mb : small ? CPU_MAX_MB : GPU_MAX_MB) * 1048576.0};
  loom_profile *prof = NULL;
  char *notes = NULL;
  st = loom_sim_calibrate(world, ops, &o, &prof, &notes, &err);
  if (st == LOOM_OK && launch.rank == 0) {
    char *body = loom_text_print(&prof->base);
    /* What was written must load as a profile: the same checks as any other. */
    loom_profile *check = NULL;
    st = loom_profile_parse(body, strlen(body), out, &check, &err);
    loom_profile_free(check);
    const loom_chunk chunks[] = {{notes, strlen(notes)}, {body, strlen(body)}};
    if (st == LOOM_OK) st = loom_write_file_atomic(out, chunks, 2, &err);
    if (st == LOOM_OK) {
      fputs(notes, stdout);
      loom_log_info("wrote %s (%d rank%s on %s)", out, launch.size, launch.size > 1 ? "s" : "", desc);
    }
    free(body);
  }
  free(notes);
  loom_profile_free(prof);
  loom_profile_free(from);
  if (world) loom_device_world_free(world, launch.world);
  loom_launch_finish(&launch);
  return loom_report(st, &err);
}
