/*
 * aot_estimate.c - a predicted step time from a hardware profile (aot.h;
 * model: the scaling book's roofline per kernel and alpha-beta cost per
 * collective; its profile format: man/shmap.7, "Planning at scale").
 *
 * Each equation runs after the one before it, as the compiled executor
 * runs them (shmap overlaps no communication with compute), so the step
 * time is the sum of:
 *   - a kernel: max(flops / peak FLOP/s of its dtype, bytes accessed /
 *     memory bandwidth), bound by whichever is larger; transcendentals
 *     count as flops, unless the profile gives them a rate of their own
 *     (a CPU's: its vectorised sin or exp is tens of instructions on the
 *     cores that also issue the loads, where a TPU's or GPU's
 *     special-function units keep pace beside the vector units): then
 *     transcendentals / that rate adds to the max, not hidden under the
 *     memory traffic (bench/validate_estimate.sh's fused sin loop);
 *     plus the profile's kernel_overhead per run (dispatching a step: what
 *     a loop of tiny kernels costs; 0 when not given);
 *   - a collective: rounds x latency + bytes sent / bandwidth over the
 *     slowest link of the axes it spans, its rounds and bytes its row's
 *     (CollTraffic); on a torus the ring runs both ways, halving both;
 *   - a shard_map call: the profile's call_overhead (starting the body on
 *     every device and waiting for the last; 0 when not given).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/mem.h"
#include "base/strbuf.h"
#include "spmd/device.h"
#include "transform/aot.h"

/* ==== the profile ================================================================== */

enum { TOPO_RING, TOPO_TORUS, TOPO_SWITCH };
enum { MAX_LINKS = 16 };

typedef struct Link {
  char axis[64];       /* "" : default */
  double bandwidth, latency;
  int topology;
} Link;

typedef struct Profile {
  char name[128];
  double peak[DT_COUNT];   /* FLOP/s per dtype; 0: not given */
  double mem_bw, capacity;
  double call_overhead;    /* seconds per shard_map call; 0: not given */
  double kernel_overhead;  /* seconds per kernel run, whatever its size; 0: not given */
  double host_cores;       /* the devices are threads of one host of this many cores,
                              whose peak_flops, memory_bandwidth and transcendentals
                              they share; 0: each device has its own */
  double transcendentals;  /* exp, sin, tanh, ... per second; 0: not given (counted
                              as flops) */
  int nlinks;
  Link links[MAX_LINKS];
} Profile;

typedef struct Reader {
  yaml_document_t doc;
  const char *path;
} Reader;

__attribute__((format(printf, 3, 4)))
static int bad(const Reader *r, const yaml_node_t *n, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  err_set(ERR_VALUE, "%s:%lu: %s", r->path, n ? (unsigned long)n->start_mark.line + 1 : 0UL, msg);
  return -1;
}

static const char *scalar(const yaml_node_t *n) {
  return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int number(const Reader *r, const yaml_node_t *n, const char *key, double *out) {
  const char *s = scalar(n);
  char *end;
  errno = 0;
  double x = s ? strtod(s, &end) : 0;
  if (!s || *end || errno || !(x >= 0) || isinf(x))
    return bad(r, n, "'%s' must be a non-negative number", key);
  *out = x;
  return 0;
}

static yaml_node_t *node(const Reader *r, int id) {
  return yaml_document_get_node((yaml_document_t *)&r->doc, id);
}

static int read_peaks(const Reader *r, const yaml_node_t *m, Profile *p) {
  if (m->type != YAML_MAPPING_NODE) return bad(r, m, "'%s' must map dtype names to FLOP/s", "peak_flops");
  for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < m->data.mapping.pairs.top; q++) {
    const char *k = scalar(node(r, q->key));
    int dt = -1;
    for (int t = 0; k && t < DT_COUNT; t++)
      if (!strcmp(dt_name((DType)t), k)) dt = t;
    if (dt < 0) return bad(r, node(r, q->key), "unknown dtype '%s' in peak_flops", k ? k : "?");
    if (number(r, node(r, q->value), k, &p->peak[dt]) < 0) return -1;
  }
  return 0;
}

static int read_link(const Reader *r, const char *axis, const yaml_node_t *m, Link *l) {
  snprintf(l->axis, sizeof l->axis, "%s", strcmp(axis, "default") ? axis : "");
  l->topology = TOPO_RING;
  if (m->type != YAML_MAPPING_NODE) return bad(r, m, "link '%s' must be a mapping", axis);
  bool bw = false, lat = false;
  for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < m->data.mapping.pairs.top; q++) {
    const char *k = scalar(node(r, q->key));
    yaml_node_t *v = node(r, q->value);
    if (k && !strcmp(k, "bandwidth")) {
      if (number(r, v, k, &l->bandwidth) < 0) return -1;
      bw = l->bandwidth > 0;
    } else if (k && !strcmp(k, "latency")) {
      if (number(r, v, k, &l->latency) < 0) return -1;
      lat = true;
    } else if (k && !strcmp(k, "topology")) {
      const char *t = scalar(v);
      if (t && !strcmp(t, "ring")) l->topology = TOPO_RING;
      else if (t && !strcmp(t, "torus")) l->topology = TOPO_TORUS;
      else if (t && !strcmp(t, "switch")) l->topology = TOPO_SWITCH;
      else return bad(r, v, "topology must be ring, torus or switch, got '%s'", t ? t : "?");
    } else {
      return bad(r, node(r, q->key), "unknown key '%s' in a link (bandwidth, latency, topology)",
                 k ? k : "?");
    }
  }
  if (!bw || !lat) return bad(r, m, "link '%s' needs a positive bandwidth and a latency", axis);
  return 0;
}

static int read_links(const Reader *r, const yaml_node_t *m, Profile *p) {
  if (m->type != YAML_MAPPING_NODE) return bad(r, m, "'%s' must map mesh axis names to links", "links");
  for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < m->data.mapping.pairs.top; q++) {
    const char *k = scalar(node(r, q->key));
    if (p->nlinks == MAX_LINKS) return bad(r, node(r, q->key), "more than %s links", "16");
    if (read_link(r, k ? k : "?", node(r, q->value), &p->links[p->nlinks++]) < 0) return -1;
  }
  return 0;
}

static int read_top(const Reader *r, const yaml_node_t *root, Profile *p) {
  if (!root || root->type != YAML_MAPPING_NODE) return bad(r, root, "%s", "a profile is a mapping");
  for (yaml_node_pair_t *q = root->data.mapping.pairs.start; q < root->data.mapping.pairs.top; q++) {
    const char *k = scalar(node(r, q->key));
    yaml_node_t *v = node(r, q->value);
    int rc;
    if (k && !strcmp(k, "name")) rc = (snprintf(p->name, sizeof p->name, "%s", scalar(v) ? scalar(v) : ""), 0);
    else if (k && !strcmp(k, "peak_flops")) rc = read_peaks(r, v, p);
    else if (k && !strcmp(k, "memory_bandwidth")) rc = number(r, v, k, &p->mem_bw);
    else if (k && !strcmp(k, "memory_capacity")) rc = number(r, v, k, &p->capacity);
    else if (k && !strcmp(k, "call_overhead")) rc = number(r, v, k, &p->call_overhead);
    else if (k && !strcmp(k, "kernel_overhead")) rc = number(r, v, k, &p->kernel_overhead);
    else if (k && !strcmp(k, "host_cores")) rc = number(r, v, k, &p->host_cores);
    else if (k && !strcmp(k, "transcendentals")) rc = number(r, v, k, &p->transcendentals);
    else if (k && !strcmp(k, "links")) rc = read_links(r, v, p);
    else rc = bad(r, node(r, q->key), "unknown key '%s' (name, peak_flops, memory_bandwidth, "
                  "memory_capacity, host_cores, transcendentals, kernel_overhead, call_overhead, links)", k ? k : "?");
    if (rc < 0) return -1;
  }
  if (!(p->peak[DT_F32] > 0)) return bad(r, root, "%s needs peak_flops for float32", "a profile");
  if (!(p->mem_bw > 0)) return bad(r, root, "%s needs a positive memory_bandwidth", "a profile");
  return 0;
}

static int read_profile(const char *path, Profile *p) {
  memset(p, 0, sizeof *p);
  FILE *f = fopen(path, "rb");
  if (!f) return err_set(ERR_IO, "estimate: cannot open profile '%s': %s", path, strerror(errno)), -1;
  yaml_parser_t parser;
  Reader r = {.path = path};
  yaml_parser_initialize(&parser);
  yaml_parser_set_input_file(&parser, f);
  int rc = -1;
  if (!yaml_parser_load(&parser, &r.doc)) {
    err_set(ERR_VALUE, "%s:%lu: %s", path, (unsigned long)parser.problem_mark.line + 1,
            parser.problem ? parser.problem : "not YAML");
  } else {
    rc = read_top(&r, yaml_document_get_root_node(&r.doc), p);
    yaml_document_delete(&r.doc);
  }
  yaml_parser_delete(&parser);
  fclose(f);
  return rc;
}

/* ==== the model ==================================================================== */

/* The link a collective over [it]'s axes runs on: the slowest of theirs
 * (each axis's own, else the default). */
static const Link *link_of(const Profile *p, const AotItem *it, int *which) {
  const Link *best = NULL;
  for (int a = 0; a < it->naxes; a++) {
    const Link *l = NULL;
    for (int i = 0; i < p->nlinks; i++)
      if (!strcmp(p->links[i].axis, it->axes[a])) l = &p->links[i];
    for (int i = 0; !l && i < p->nlinks; i++)
      if (!p->links[i].axis[0]) l = &p->links[i];
    if (!l) return NULL;
    if (!best || l->bandwidth < best->bandwidth) best = l, *which = a;
  }
  return best;
}

typedef struct Timed {
  double t;
  char bound[80];
} Timed;

static int time_item(const Profile *p, const AotItem *it, Timed *o) {
  if (it->call) {
    o->t = it->count * p->call_overhead;
    snprintf(o->bound, sizeof o->bound, "%s", "call overhead");
    return 0;
  }
  if (it->kind) {
    int a = 0;
    const Link *l = it->group > 1 ? link_of(p, it, &a) : NULL;
    if (it->group > 1 && !l)
      return err_set(ERR_VALUE, "estimate: the profile has no link for mesh axis '%s' and no "
                     "default link", it->naxes ? it->axes[0] : "?"), -1;
    double steps = it->steps, bytes = it->sent;
    if (l && l->topology == TOPO_TORUS && steps > 1) steps = ceil(steps / 2), bytes /= 2;
    o->t = l ? it->count * (steps * l->latency + bytes / l->bandwidth) : 0;
    snprintf(o->bound, sizeof o->bound, "link '%s'", it->naxes ? it->axes[a] : "");
    return 0;
  }
  /* on a host, the devices of a shard_map share its cores, one thread
   * each: a device runs at 1/max(devices, cores) of the host's rates (a
   * plan outside shard_map has them all: its large kernels use every core) */
  double share = 1;
  if (p->host_cores > 0 && it->running > 0)
    share = (double)it->running > p->host_cores ? (double)it->running : p->host_cores;
  double peak = (p->peak[it->dtype] > 0 ? p->peak[it->dtype] : p->peak[DT_F32]) / share;
  /* with a rate of their own (a CPU's), transcendentals are long
   * polynomial code on the cores that also issue the loads: their time
   * adds to the roofline's instead of hiding under the memory traffic */
  double tt = p->transcendentals > 0 ? it->transcendentals / (p->transcendentals / share) : 0;
  double tc = p->transcendentals > 0 ? it->flops / peak : (it->flops + it->transcendentals) / peak;
  double tm = it->bytes / (p->mem_bw / share);
  /* a fused loop's other equations (merge_fusions) are no kernel of their own */
  double launch = it->bytes > 0 || it->flops > 0 ? it->count * p->kernel_overhead : 0;
  o->t = (tc > tm ? tc : tm) + tt + launch;
  snprintf(o->bound, sizeof o->bound, "%s", tc + tt > tm ? "compute" : "memory");
  return 0;
}

static void fmt_time(char *buf, size_t cap, double t) {
  if (t >= 1) snprintf(buf, cap, "%.3f s", t);
  else if (t >= 1e-3) snprintf(buf, cap, "%.3f ms", t * 1e3);
  else snprintf(buf, cap, "%.3f us", t * 1e6);
}

static void fmt_bytes(char *buf, size_t cap, double b) {
  if (b < 1024) snprintf(buf, cap, "%.0f B", b);
  else if (b < 1024.0 * 1024) snprintf(buf, cap, "%.1f KiB", b / 1024);
  else if (b < 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.1f MiB", b / (1024.0 * 1024));
  else snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
}

/* A bound's share of the time, by its name. */
typedef struct Share {
  char name[80];
  double t;
} Share;

static void add_share(Share *s, int *n, int cap, const char *name, double t) {
  for (int i = 0; i < *n; i++)
    if (!strcmp(s[i].name, name)) {
      s[i].t += t;
      return;
    }
  if (*n < cap) {
    snprintf(s[*n].name, sizeof s[*n].name, "%s", name);
    s[(*n)++].t = t;
  }
}

static const char *top_share(const Share *s, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (s[i].t > s[best].t) best = i;
  return n ? s[best].name : "nothing";
}

static int cmp_int(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* A fused loop is one kernel: its roofline is of its summed flops and
 * its bytes, carried by its first item (on its first equation's line).
 * Its items need not be adjacent: a loop may take equations from after
 * a product (compile.c's scheduling).  0, or -1 when out of memory. */
static int merge_fusions(AotCost *c) {
  int *head = shm_malloc(sizeof(int) * ((size_t)c->nfusions + 1));
  if (!head) return err_nomem(), -1;
  for (int f = 0; f <= c->nfusions; f++) head[f] = -1;
  for (int i = 0; i < c->n; i++) {
    AotItem *it = &c->items[i];
    int f = it->fusion;
    if (f <= 0 || f > c->nfusions) continue;
    it->fusion = 0;
    if (head[f] < 0) {
      head[f] = i;
      continue;
    }
    AotItem *h = &c->items[head[f]];
    h->flops += it->flops, h->transcendentals += it->transcendentals, h->bytes += it->bytes;
    it->flops = it->transcendentals = it->bytes = 0;
  }
  shm_free(head);
  return 0;
}

/* The per-line table of [c] into [sb]; the total into *[total]. */
static int report_lines(const Profile *p, AotCost *c, StrBuf *sb, double *total,
                        Share *all, int *nall) {
  Timed *tm = shm_calloc((size_t)c->n + 1, sizeof *tm);
  int *ls = shm_calloc((size_t)c->n + 1, sizeof(int));
  if (!tm || !ls) {
    shm_free(tm), shm_free(ls);
    return err_nomem(), -1;
  }
  if (merge_fusions(c) < 0) {
    shm_free(tm), shm_free(ls);
    return -1;
  }
  for (int i = 0; i < c->n; i++) {
    if (time_item(p, &c->items[i], &tm[i]) < 0) {
      shm_free(tm), shm_free(ls);
      return -1;
    }
    /* a profile without call_overhead gives a shard_map call no row */
    ls[i] = c->items[i].call && !(p->call_overhead > 0) ? INT_MAX : c->items[i].line;
    *total += tm[i].t;
    add_share(all, nall, 32, tm[i].bound, tm[i].t);
  }
  qsort(ls, (size_t)c->n, sizeof *ls, cmp_int);
  sbuf_printf(sb, "%6s  %12s  %-16s %12s %12s %12s\n", "line", "time", "bound", "flops",
              "bytes", "sent");
  for (int i = 0; i < c->n && ls[i] != INT_MAX; i++) {
    if (i && ls[i] == ls[i - 1]) continue;
    Share sh[8];
    int nsh = 0;
    double t = 0, f = 0, b = 0, sent = 0;
    for (int k = 0; k < c->n; k++) {
      const AotItem *it = &c->items[k];
      if (it->line != ls[i]) continue;
      t += tm[k].t, f += it->flops + it->transcendentals, b += it->bytes, sent += it->sent * it->count;
      add_share(sh, &nsh, 8, tm[k].bound, tm[k].t);
    }
    char ts[32], bs[32], ss[32];
    fmt_time(ts, sizeof ts, t);
    fmt_bytes(bs, sizeof bs, b);
    fmt_bytes(ss, sizeof ss, sent);
    sbuf_printf(sb, "%6d  %12s  %-16s %12.4g %12s %12s\n", ls[i], ts, top_share(sh, nsh), f, bs, ss);
  }
  shm_free(tm), shm_free(ls);
  return 0;
}

Value *aot_estimate(Plan *plan, const Mesh *within, const char *path, double *seconds) {
  Profile p;
  if (read_profile(path, &p) < 0) return NULL;
  AotCost c = {0};
  AotMemory m;
  StrBuf sb = {0};
  double total = 0;
  Share all[32];
  int nall = 0;
  Value *r = NULL;
  /* compiled first: a compiled xmap is costed by the plan it runs */
  if (aot_memory(plan, &m) < 0 || aot_cost(plan, within, &c) < 0) goto out;
  sbuf_printf(&sb, "predicted step time of %s on %s, per device of %lld:\n",
              plan->name ? plan->name : "<plan>", p.name[0] ? p.name : path, (long long)c.devices);
  if (report_lines(&p, &c, &sb, &total, all, &nall) < 0) goto out;
  char ts[32], mem[32], cap[32];
  fmt_time(ts, sizeof ts, total);
  double peak = m.argument + m.output + m.temp + m.constant;
  fmt_bytes(mem, sizeof mem, peak);
  fmt_bytes(cap, sizeof cap, p.capacity);
  sbuf_printf(&sb, "total: %s (bound: %s)\nmemory per device: %s", ts, top_share(all, nall), mem);
  if (p.capacity > 0) sbuf_printf(&sb, " of %s", cap);
  if (p.capacity > 0 && peak > p.capacity)
    sbuf_printf(&sb, "\nwarning: per-device memory %s exceeds the capacity %s of %s", mem, cap,
                p.name[0] ? p.name : path);
  *seconds = total;
  r = sb.failed ? err_nomem() : str_from(sbuf_text(&sb));
out:
  sbuf_free(&sb);
  aot_cost_free(&c);
  return r;
}

/* ==== --estimate ===================================================================== */

enum { MAX_NOTED = 256 };
static const char *est_path;
static pthread_mutex_t est_lock = PTHREAD_MUTEX_INITIALIZER;
static Plan *noted[MAX_NOTED];
static Value *noted_mesh[MAX_NOTED];   /* owned: the body's mesh it was noted in, or NULL */
static int nnoted;

void aot_estimate_on(const char *path) { est_path = path; }

/* The mesh of the shard_map body this thread runs, as an abstract mesh
 * of its names and sizes (a new reference), or NULL outside a body. */
static Value *body_mesh(void) {
  const DevCtx *d = dev_ctx();
  if (!d || !d->mesh) return NULL;
  int64_t sizes[DEV_MAX_AXES];
  for (int a = 0; a < d->mesh->naxes; a++) sizes[a] = d->mesh->sizes[a];
  Value *m = mesh_new_abstract(d->mesh->naxes, d->mesh->names, sizes);
  if (!m) err_clear();   /* estimated as outside a body, then */
  return m;
}

void aot_estimate_note(const char *name, Plan *p) {
  (void)name;
  if (!est_path) return;
  Value *mesh = body_mesh();
  pthread_mutex_lock(&est_lock);
  bool seen = false;
  for (int i = 0; i < nnoted; i++) seen |= noted[i] == p;
  if (!seen && nnoted < MAX_NOTED) {
    noted_mesh[nnoted] = mesh;
    noted[nnoted++] = (Plan *)val_incref(&p->hdr);
    mesh = NULL;
  }
  pthread_mutex_unlock(&est_lock);
  val_decref(mesh);
}

int aot_estimate_report(FILE *f) {
  int rc = 0;
  for (int i = 0; i < nnoted; i++) {
    double t;
    Value *s = rc == 0 ? aot_estimate(noted[i], (const Mesh *)noted_mesh[i], est_path, &t) : NULL;
    if (s) fprintf(f, "%s\n", str_cstr(s));
    else if (rc == 0) {
      fprintf(f, "shmap: --estimate: %s\n", err_message());
      err_clear();
      rc = -1;
    }
    val_decref(s);
    val_decref(&noted[i]->hdr);
    val_decref(noted_mesh[i]);
  }
  nnoted = 0;
  return rc;
}
