/*
 * calibrate.h - `shmap --calibrate`: measures this machine's peak
 * float32 FLOP/s, memory bandwidth and the device threads' collective
 * latency and bandwidth, and prints them as a hardware profile (YAML) for
 * `--estimate` and Compiled.estimate (transform/aot.h).
 */
#ifndef SHMAP_CALIBRATE_H
#define SHMAP_CALIBRATE_H

/* The shmap program that measures and prints the profile; main.c runs it
 * as it runs `-c` code. */
extern const char calibrate_program[];

#endif
