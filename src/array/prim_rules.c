/*
 * prim_rules.c - the helpers of the rules that the transformations borrow
 * (prim.h): zeros and sums of cotangents for the transpose interpreter,
 * and the batch-axis moves of the batching interpreter; the errors
 * Explicit mode's sharding rules raise.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "array/prim_rules.h"


Value *prim_zeros(const AVal *a) {
  Scope s = {0};
  return scope_return(&s, zeros_of(&s, a));
}

Value *prim_add_any(Value *a, Value *b) {
  if (!a || !b) return a ? val_incref(a) : b ? val_incref(b) : NULL;
  Scope s = {0};
  return scope_return(&s, add(&s, a, b));
}

Value *prim_batch_moveaxis(Value *x, int from, int to) { return moveaxis(x, from, to); }

Value *prim_batch_repeat_front(Value *x, int64_t b) { return repeat_front(x, b); }

int64_t prim_batch_size(Value **in, const int *dims, int nin) {
  for (int i = 0; i < nin; i++) {
    AVal a;
    if (dims[i] >= 0 && prim_value_aval(in[i], &a) == 0) return a.shape[dims[i]];
  }
  return 1;
}

/* ---- costs ---- */

static double elements(const AVal *a) { return (double)shape_size(a->ndim, a->shape); }

void prim_cost_per_element(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                           PrimCost *c) {
  (void)p, (void)nin, (void)in;
  for (int i = 0; i < nout; i++) c->flops += elements(&out[i]);
}

void prim_cost_transcendental(const Params *p, int nin, const AVal *in, int nout,
                              const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)in;
  for (int i = 0; i < nout; i++) c->transcendentals += elements(&out[i]);
}

/* A reduction of n elements into m results applies its operator n - m
 * times (a cumulative one: once per element past the first of a run,
 * about n as well). */
void prim_cost_reduction(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                         PrimCost *c) {
  (void)p;
  double n = nin ? elements(&in[0]) : 0, m = nout ? elements(&out[0]) : 0;
  c->flops += n > m ? n - m : n;
}

/* ---- Explicit mode's errors ---- */

/* The ShardingTypeError [fmt] formats, after [op] and a space when [op]
 * is not NULL.  -1. */
static int vtype_error(const char *op, const char *fmt, va_list ap) {
  char text[1024];
  vsnprintf(text, sizeof text, fmt, ap);
  if (op) err_set(ERR_TYPE, "ShardingTypeError: %s %s", op, text);
  else err_set(ERR_TYPE, "ShardingTypeError: %s", text);
  return -1;
}

int sh_type_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vtype_error(prim_sharding_op(), fmt, ap);
  va_end(ap);
  return rc;
}

int sh_type_error_text(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = vtype_error(NULL, fmt, ap);
  va_end(ap);
  return rc;
}

/* The name of mesh axis [a] of [s]. */
static const char *axis_name(const Sharding *s, int a, char *tmp, size_t cap) {
  if (s->axis_names) return s->axis_names[a];
  snprintf(tmp, cap, "axis%d", a);
  return tmp;
}

/* Appends [a] then [b] to [buf] at [*n] (bounded by [cap]). */
static void put(char *buf, size_t cap, size_t *n, const char *a, const char *b) {
  if (*n >= cap) return;
  int w = snprintf(buf + *n, cap - *n, "%s%s", a, b ? b : "");
  if (w > 0) *n += (size_t)w;
}

/* One spec entry as Python prints it: None, 'X' or ('X', 'Y'). */
static void put_entry(const Sharding *s, int d, char *buf, size_t cap, size_t *n) {
  char tmp[16];
  if (!s->nsplit[d]) {
    put(buf, cap, n, "None", NULL);
    return;
  }
  if (s->nsplit[d] > 1) put(buf, cap, n, "(", NULL);
  for (int k = 0; k < s->nsplit[d]; k++) {
    put(buf, cap, n, k ? ", '" : "'", axis_name(s, s->split[d][k], tmp, sizeof tmp));
    put(buf, cap, n, "'", NULL);
  }
  if (s->nsplit[d] > 1) put(buf, cap, n, ")", NULL);
}

void sh_spec_tuple(const Sharding *s, int n, const int64_t *dims, char *buf, size_t cap) {
  size_t w = 0;
  buf[0] = 0;
  put(buf, cap, &w, "(", NULL);
  for (int i = 0; i < n; i++) {
    if (i) put(buf, cap, &w, ", ", NULL);
    put_entry(s, dims ? (int)dims[i] : i, buf, cap, &w);
  }
  put(buf, cap, &w, n == 1 ? ",)" : ")", NULL);
}

void sh_named_str(const Sharding *s, char *buf, size_t cap) {
  size_t w = 0;
  char tmp[16], size[32], spec[256];
  Sharding type;
  buf[0] = 0;
  put(buf, cap, &w, "NamedSharding(mesh=Mesh(", NULL);
  for (int a = 0; a < s->naxes; a++) {
    snprintf(size, sizeof size, "': %d", s->axis_sizes[a]);
    put(buf, cap, &w, a ? ", '" : "'", axis_name(s, a, tmp, sizeof tmp));
    put(buf, cap, &w, size, NULL);
  }
  sh_type_of(s, &type);
  sh_spec_tuple(&type, type.ndim, NULL, spec, sizeof spec);
  /* a spec prints as P(...): the tuple's parentheses, no trailing comma */
  size_t n = strlen(spec);
  if (n >= 3 && spec[n - 2] == ',') spec[n - 2] = ')', spec[n - 1] = 0;
  put(buf, cap, &w, "), spec=P", spec);
  put(buf, cap, &w, ")", NULL);
}

void sh_aval_str(const AVal *a, const Sharding *s, char *buf, size_t cap) {
  char t[512];
  sh_type_str(a, s, t, sizeof t);
  const char *dims = strchr(t, '[');
  snprintf(buf, cap, "%s%s", dt_name(a->dtype), dims ? dims : "[]");
}

void sh_aval_repr(const AVal *a, const Sharding *s, char *buf, size_t cap) {
  char t[512];
  sh_aval_str(a, s, t, sizeof t);
  snprintf(buf, cap, "ShapedArray(%s)", t);
}

void sh_type_str(const AVal *a, const Sharding *s, char *buf, size_t cap) {
  size_t w = 0;
  char tmp[16], size[32];
  buf[0] = 0;
  put(buf, cap, &w, dt_short(a->dtype), "[");
  for (int d = 0; d < a->ndim; d++) {
    snprintf(size, sizeof size, "%s%lld", d ? "," : "", (long long)a->shape[d]);
    put(buf, cap, &w, size, NULL);
    int shown = 0;
    for (int k = 0; k < s->nsplit[d]; k++) shown += sh_typed(s, 1u << s->split[d][k]);
    for (int k = 0, j = 0; shown && k < s->nsplit[d]; k++) {
      if (!sh_typed(s, 1u << s->split[d][k])) continue;
      put(buf, cap, &w, j++ ? "," : shown > 1 ? "@(" : "@", axis_name(s, s->split[d][k], tmp, sizeof tmp));
    }
    if (shown > 1) put(buf, cap, &w, ")", NULL);
  }
  put(buf, cap, &w, "]", NULL);
}

int sh_check_unique(const AVal *in, const Sharding *in_sh, int nin, const Sharding *res, int n) {
  uint32_t seen = 0;
  for (int d = 0; d < n; d++)
    for (int k = 0; k < res->nsplit[d]; k++) {
      uint32_t bit = 1u << res->split[d][k];
      if ((seen & bit) && sh_typed(res, bit)) {
        char tmp[16], spec[256], types[1024];
        size_t w = 0;
        types[0] = 0;
        for (int i = 0; i < nin; i++) {
          char one[256];
          sh_type_str(&in[i], &in_sh[i], one, sizeof one);
          put(types, sizeof types, &w, i ? ", " : "", one);
        }
        sh_spec_tuple(res, n, NULL, spec, sizeof spec);
        return sh_type_error("operation with inputs %s would produce an illegally sharded result "
                             "%s: mesh axis '%s' splits two of its dimensions (JAX's "
                             "DuplicateSpecError); reshard an operand, or say the result's layout "
                             "(out_sharding=, auto_axes)",
                             types, spec, axis_name(res, res->split[d][k], tmp, sizeof tmp));
      }
      seen |= bit;
    }
  return 0;
}

/* The operands' specs, "('X', None), (None, 'X')", for a message. */
static void operand_specs(const AVal *in, const Sharding *in_sh, int nin, char *buf, size_t cap) {
  size_t w = 0;
  buf[0] = 0;
  for (int i = 0; i < nin; i++) {
    char one[256];
    if (!in[i].ndim) continue;
    sh_spec_tuple(&in_sh[i], in[i].ndim, NULL, one, sizeof one);
    put(buf, cap, &w, w ? ", " : "", one);
  }
}

int sh_check_broadcast(const AVal *in, const Sharding *in_sh, int nin, int nd) {
  Sharding res;
  sh_replicated(&res, nd, &in_sh[0]);
  for (int d = 0; d < nd; d++) {
    int first = -1;
    for (int i = 0; i < nin; i++) {
      if (in[i].ndim != nd || !in_sh[i].nsplit[d]) continue;
      if (first < 0) {
        first = i;
        sh_copy_dim(&res, d, &in_sh[i], d);
      } else if (!sh_same_dim(&in_sh[first], d, &in_sh[i], d) &&
                 sh_typed(&in_sh[i], sh_dim_axes(&in_sh[i], d) | sh_dim_axes(&in_sh[first], d))) {
        char specs[1024];
        operand_specs(in, in_sh, nin, specs, sizeof specs);
        return sh_type_error("got incompatible shardings for broadcasting: %s; lay the operands "
                             "out alike first (jax.sharding.reshard)", specs);
      }
    }
  }
  return sh_check_unique(in, in_sh, nin, &res, nd);
}

/* ---- the types of results (JAX's rules over the Explicit axes) ---- */

void sh_type_of(const Sharding *s, Sharding *type) {
  *type = *s;
  type->partial = 0;
  type->partial_coll = NULL;
  for (int d = 0; d < s->ndim; d++) {
    int k = 0;
    for (int j = 0; j < s->nsplit[d]; j++)
      if (sh_typed(s, 1u << s->split[d][j])) type->split[d][k++] = s->split[d][j];
    type->nsplit[d] = (uint8_t)k;
  }
}

bool sh_same_type(const Sharding *a, const Sharding *b) {
  Sharding ta, tb;
  if (a->ndim != b->ndim) return false;
  sh_type_of(a, &ta);
  sh_type_of(b, &tb);
  for (int d = 0; d < a->ndim; d++)
    if (!sh_same_dim(&ta, d, &tb, d)) return false;
  return true;
}

int sh_retype(Sharding *out_sh, const Sharding *type) {
  if (sh_same_type(out_sh, type)) return 0;
  sh_type_of(type, out_sh);
  return 1;
}

/* "(1, 4)": [n] sizes as a Python tuple. */
static void sizes_tuple(int n, const int64_t *xs, char *buf, size_t cap) {
  size_t w = 0;
  buf[0] = 0;
  put(buf, cap, &w, "(", NULL);
  for (int i = 0; i < n; i++) {
    char one[32];
    snprintf(one, sizeof one, "%s%lld", i ? ", " : "", (long long)xs[i]);
    put(buf, cap, &w, one, NULL);
  }
  put(buf, cap, &w, n == 1 ? ",)" : ")", NULL);
}

int sh_varying_out(const AVal *in, const Sharding *s, const AVal *out, const char *name,
                   Sharding *type) {
  bool ones = true;
  for (int d = 0; d < out->ndim; d++) ones &= out->shape[d] == 1;
  sh_type_of(s, type);
  type->ndim = out->ndim;
  if (ones) {
    for (int d = 0; d < out->ndim; d++) type->nsplit[d] = 0;
    return 0;
  }
  for (int d = 0; d < in->ndim && d < out->ndim; d++) {
    int64_t b = sh_dim_blocks(type, d);
    if (in->shape[d] == out->shape[d] || !type->nsplit[d] || out->shape[d] % b == 0) continue;
    char tmp[16], spec[128], ty[256], shape[256];
    size_t w = 0;
    spec[0] = 0;
    if (type->nsplit[d] == 1) {
      put(spec, sizeof spec, &w, axis_name(type, type->split[d][0], tmp, sizeof tmp), NULL);
    } else {
      Sharding one = *type;
      one.nsplit[0] = type->nsplit[d];
      memcpy(one.split[0], type->split[d], sizeof one.split[0]);
      put_entry(&one, 0, spec, sizeof spec, &w);
    }
    sh_aval_str(in, s, ty, sizeof ty);
    sizes_tuple(out->ndim, out->shape, shape, sizeof shape);
    return sh_type_error_text("%s on sharded dims where out dim (%lld) is not divisible by mesh "
                              "axes (%lld) with spec (%s) is not implemented. Got input type=%s "
                              "and output shape=%s", name, (long long)out->shape[d],
                              (long long)b, spec, ty, shape);
  }
  return 0;
}

int sh_check_same_types(const AVal *in, const Sharding *in_sh, int from, int nin, const char *what) {
  for (int i = from + 1; i < nin; i++) {
    if (sh_same_type(&in_sh[from], &in_sh[i])) continue;
    char types[1024];
    size_t w = 0;
    types[0] = 0;
    for (int j = from; j < nin; j++) {
      char one[256];
      sh_type_str(&in[j], &in_sh[j], one, sizeof one);
      put(types, sizeof types, &w, j > from ? ", " : "", one);
    }
    return sh_type_error("%s. Got %s; reshard them alike first (jax.sharding.reshard)", what, types);
  }
  return 0;
}
