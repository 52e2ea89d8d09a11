/*
 * config.c - the YAML configuration file (libyaml's document API).
 *
 * The accepted keys are one table (KEYS below): the walker checks every
 * node against it, so an unknown key or a wrong type is reported with the
 * node's own line and column, and adding an option is one table line.
 */
#include "cli/config.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "base/error.h"
#include "base/mem.h"

ShmOptions shm_options;

typedef enum { KEY_INT, KEY_BOOL, KEY_PATH, KEY_MAP } KeyKind;

/* One accepted key: where its value goes in ShmOptions and its bounds. */
typedef struct KeySpec {
  const char *name;
  KeyKind kind;
  size_t offset;              /* into ShmOptions; unused for KEY_MAP */
  int min, max;               /* KEY_INT bounds, inclusive */
  const struct KeySpec *sub;  /* KEY_MAP: its keys, NULL-name terminated */
} KeySpec;

#define OPT(field) offsetof(ShmOptions, field)

static const KeySpec PRINT_KEYS[] = {
    {"precision", KEY_INT, OPT(print.precision), 0, 100, NULL},
    {"threshold", KEY_INT, OPT(print.threshold), 0, INT_MAX, NULL},
    {"edgeitems", KEY_INT, OPT(print.edgeitems), 0, INT_MAX, NULL},
    {"linewidth", KEY_INT, OPT(print.linewidth), 1, INT_MAX, NULL},
    {"suppress", KEY_BOOL, OPT(print.suppress), 0, 0, NULL},
    {NULL, KEY_INT, 0, 0, 0, NULL},
};

static const KeySpec HISTORY_KEYS[] = {
    {"size", KEY_INT, OPT(history_size), 0, INT_MAX, NULL},
    {"file", KEY_PATH, OPT(history_file), 0, 0, NULL},
    {NULL, KEY_INT, 0, 0, 0, NULL},
};

static const KeySpec JIT_KEYS[] = {
    {"cache_size", KEY_INT, OPT(jit_cache_size), 1, 1 << 20, NULL},
    {NULL, KEY_INT, 0, 0, 0, NULL},
};

static const KeySpec MEMORY_KEYS[] = {
    {"buffer_cache_mib", KEY_INT, OPT(buffer_cache_mib), 0, 1 << 20, NULL},
    {NULL, KEY_INT, 0, 0, 0, NULL},
};

static const KeySpec KEYS[] = {
    {"print", KEY_MAP, 0, 0, 0, PRINT_KEYS},
    {"history", KEY_MAP, 0, 0, 0, HISTORY_KEYS},
    {"memory", KEY_MAP, 0, 0, 0, MEMORY_KEYS},
    {"jit", KEY_MAP, 0, 0, 0, JIT_KEYS},
    {"devices", KEY_INT, OPT(devices), 1, CFG_MAX_DEVICES, NULL},
    {NULL, KEY_INT, 0, 0, 0, NULL},
};

/* What the walker needs besides the node: the document, the source for
 * error locations, and the options being filled. */
typedef struct Walk {
  yaml_document_t *doc;
  Source *src;
  ShmOptions *opts;
} Walk;

void cfg_defaults(ShmOptions *o) {
  memset(o, 0, sizeof *o);
  o->devices = CFG_DEFAULT_DEVICES;
  o->print = print_options;
  o->history_size = CFG_DEFAULT_HISTORY;
  o->buffer_cache_mib = (int)(SHM_BUF_CACHE_DEFAULT >> 20);
  o->jit_cache_size = CFG_DEFAULT_JIT_CACHE;
}

void cfg_free(ShmOptions *o) {
  shm_free(o->history_file);
  shm_free(o->config_file);
  o->history_file = NULL;
  o->config_file = NULL;
}

/* "dir" + "/" + "rest" as a new string, or NULL on out of memory. */
static char *join_path(const char *dir, const char *rest) {
  size_t n = strlen(dir) + strlen(rest) + 2;
  char *p = shm_malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, rest);
  return p;
}

char *cfg_default_path(void) {
  const char *env = getenv("SHMAP_CONFIG");
  if (env) return *env ? shm_strdup(env) : NULL;
  const char *xdg = getenv("XDG_CONFIG_HOME");
  if (xdg && *xdg) return join_path(xdg, "shmap/config.yaml");
  const char *home = getenv("HOME");
  if (home && *home) return join_path(home, ".config/shmap/config.yaml");
  return NULL;
}

int cfg_parse_devices(const char *s) {
  char *end;
  if (!s || *s < '0' || *s > '9') return -1;
  errno = 0;
  long n = strtol(s, &end, 10);
  if (errno || *end || n < 1 || n > CFG_MAX_DEVICES) return -1;
  return (int)n;
}

/* Sets the error at [node]'s position (libyaml counts from 0). */
static int fail_at(Walk *w, const yaml_node_t *node, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail_at(Walk *w, const yaml_node_t *node, const char *fmt, ...) {
  Loc loc = {w->src, (int)node->start_mark.line + 1, (int)node->start_mark.column + 1};
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  err_set_at(loc, ERR_VALUE, "%s", msg);
  return -1;
}

static const char *scalar_text(const yaml_node_t *node) {
  return (const char *)node->data.scalar.value;
}

static bool is_plain_scalar(const yaml_node_t *node) {
  return node->type == YAML_SCALAR_NODE &&
         node->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

/* Parses a plain decimal integer with an optional sign; false otherwise. */
static bool scalar_int(const yaml_node_t *node, long *out) {
  if (!is_plain_scalar(node)) return false;
  const char *s = scalar_text(node);
  const char *digits = (*s == '-' || *s == '+') ? s + 1 : s;
  if (*digits < '0' || *digits > '9') return false;
  char *end;
  errno = 0;
  *out = strtol(s, &end, 10);
  return !errno && !*end;
}

/* YAML 1.2 core schema booleans. */
static bool scalar_bool(const yaml_node_t *node, bool *out) {
  static const char *const yes[] = {"true", "True", "TRUE"};
  static const char *const no[] = {"false", "False", "FALSE"};
  if (!is_plain_scalar(node)) return false;
  for (int i = 0; i < 3; i++) {
    bool is_yes = strcmp(scalar_text(node), yes[i]) == 0;
    if (is_yes || strcmp(scalar_text(node), no[i]) == 0) {
      *out = is_yes;
      return true;
    }
  }
  return false;
}

/* A leading "~/" is the home directory, as a shell would read it. */
static char *expand_home(const char *path) {
  const char *home = getenv("HOME");
  if (path[0] == '~' && path[1] == '/' && home && *home)
    return join_path(home, path + 2);
  return shm_strdup(path);
}

static int set_int(Walk *w, const KeySpec *k, const char *qname, yaml_node_t *v) {
  long n;
  if (!scalar_int(v, &n) || n < k->min) {
    const char *what = k->min >= 1 ? "a positive integer" : "a non-negative integer";
    return fail_at(w, v, "%s must be %s", qname, what);
  }
  if (n > k->max) {
    return fail_at(w, v, "%s must be at most %d", qname, k->max);
  }
  *(int *)((char *)w->opts + k->offset) = (int)n;
  return 0;
}

static int set_bool(Walk *w, const KeySpec *k, const char *qname, yaml_node_t *v) {
  bool b;
  if (!scalar_bool(v, &b)) return fail_at(w, v, "%s must be true or false", qname);
  *(bool *)((char *)w->opts + k->offset) = b;
  return 0;
}

static int set_path(Walk *w, const KeySpec *k, const char *qname, yaml_node_t *v) {
  if (v->type != YAML_SCALAR_NODE || !*scalar_text(v))
    return fail_at(w, v, "%s must be a file name", qname);
  char **slot = (char **)((char *)w->opts + k->offset);
  char *path = expand_home(scalar_text(v));
  if (!path) {
    err_nomem();
    return -1;
  }
  shm_free(*slot);
  *slot = path;
  return 0;
}

static int walk_map(Walk *w, yaml_node_t *map, const KeySpec *keys, const char *prefix);

/* The names in [keys], comma separated, for "expected one of" messages. */
static void key_list(const KeySpec *keys, char *buf, size_t size) {
  buf[0] = '\0';
  for (const KeySpec *k = keys; k->name; k++) {
    size_t used = strlen(buf);
    snprintf(buf + used, size - used, "%s%s", k == keys ? "" : ", ", k->name);
  }
}

static int walk_value(Walk *w, const KeySpec *k, const char *qname, yaml_node_t *v) {
  switch (k->kind) {
  case KEY_INT: return set_int(w, k, qname, v);
  case KEY_BOOL: return set_bool(w, k, qname, v);
  case KEY_PATH: return set_path(w, k, qname, v);
  case KEY_MAP: return walk_map(w, v, k->sub, qname);
  }
  return 0;
}

static int walk_pair(Walk *w, yaml_node_pair_t *pair, const KeySpec *keys, const char *prefix) {
  yaml_node_t *key = yaml_document_get_node(w->doc, pair->key);
  yaml_node_t *val = yaml_document_get_node(w->doc, pair->value);
  if (!key || !val) return 0;
  if (key->type != YAML_SCALAR_NODE) return fail_at(w, key, "keys must be plain names");
  char qname[128];
  snprintf(qname, sizeof qname, "%s%s%s", prefix, *prefix ? "." : "", scalar_text(key));
  for (const KeySpec *k = keys; k->name; k++)
    if (strcmp(k->name, scalar_text(key)) == 0) return walk_value(w, k, qname, val);
  char expected[256];
  key_list(keys, expected, sizeof expected);
  return fail_at(w, key, "unknown key '%s' (expected one of: %s)", qname, expected);
}

/* A key given twice in one mapping is an error at the second: YAML leaves
 * it to the reader, and taking either value would ignore the other. */
static int check_duplicate(Walk *w, yaml_node_t *map, yaml_node_pair_t *pair, const char *prefix) {
  yaml_node_t *key = yaml_document_get_node(w->doc, pair->key);
  if (!key || key->type != YAML_SCALAR_NODE) return 0;
  for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < pair; q++) {
    yaml_node_t *k = yaml_document_get_node(w->doc, q->key);
    if (k && k->type == YAML_SCALAR_NODE && !strcmp(scalar_text(k), scalar_text(key)))
      return fail_at(w, key, "duplicate key '%s%s%s' (first given at line %d)", prefix,
                     *prefix ? "." : "", scalar_text(key), (int)k->start_mark.line + 1);
  }
  return 0;
}

static int walk_map(Walk *w, yaml_node_t *map, const KeySpec *keys, const char *prefix) {
  if (map->type == YAML_SCALAR_NODE && !*scalar_text(map) && is_plain_scalar(map))
    return 0;  /* "print:" with nothing under it */
  if (map->type != YAML_MAPPING_NODE)
    return fail_at(w, map, "%s must be a mapping of keys to values",
                   *prefix ? prefix : "the file");
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++)
    if (check_duplicate(w, map, p, prefix) < 0 || walk_pair(w, p, keys, prefix) < 0) return -1;
  return 0;
}

/* Reports libyaml's own syntax error, at the place it names. */
static int yaml_syntax_error(Walk *w, const yaml_parser_t *parser) {
  Loc loc = {w->src, (int)parser->problem_mark.line + 1, (int)parser->problem_mark.column + 1};
  const char *problem = parser->problem ? parser->problem : "malformed YAML";
  if (parser->context)
    err_set_at(loc, ERR_VALUE, "invalid YAML: %s %s", problem, parser->context);
  else
    err_set_at(loc, ERR_VALUE, "invalid YAML: %s", problem);
  return -1;
}

/* The file is one document: a second one (after "---") would be ignored,
 * so it is an error at its start. */
static int no_second_document(Walk *w, yaml_parser_t *parser) {
  yaml_document_t doc;
  if (!yaml_parser_load(parser, &doc)) return yaml_syntax_error(w, parser);
  yaml_node_t *root = yaml_document_get_root_node(&doc);
  int rc = 0;
  if (root) {
    Loc loc = {w->src, (int)doc.start_mark.line + 1, (int)doc.start_mark.column + 1};
    err_set_at(loc, ERR_VALUE, "the file must hold one YAML document; a second one starts here");
    rc = -1;
  }
  yaml_document_delete(&doc);
  return rc;
}

/* Parses the text of [src] and walks its one document into [o]. */
static int parse_and_walk(Source *src, ShmOptions *o) {
  yaml_parser_t parser;
  yaml_document_t doc;
  Walk w = {&doc, src, o};
  if (!yaml_parser_initialize(&parser)) {
    err_nomem();
    return -1;
  }
  yaml_parser_set_input_string(&parser, (const unsigned char *)src->text, strlen(src->text));
  int rc = -1;
  if (!yaml_parser_load(&parser, &doc)) {
    rc = yaml_syntax_error(&w, &parser);
  } else {
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    rc = root ? walk_map(&w, root, KEYS, "") : 0;
    yaml_document_delete(&doc);
    if (rc == 0) rc = no_second_document(&w, &parser);
  }
  yaml_parser_delete(&parser);
  return rc;
}

int cfg_load(ShmOptions *o, const char *path, bool must_exist) {
  FILE *probe = fopen(path, "r");
  if (!probe) {
    if (errno == ENOENT && !must_exist) return 0;
    err_set(ERR_IO, "cannot open config file '%s': %s", path, strerror(errno));
    return -1;
  }
  /* refused before parsing: a configuration is a few lines, and libyaml
   * takes minutes over a pathological one (nesting 100k deep) */
  long size = fseek(probe, 0, SEEK_END) == 0 ? ftell(probe) : -1;
  fclose(probe);
  if (size > CFG_MAX_BYTES) {
    err_set(ERR_VALUE, "config file '%s' is %ld bytes; a configuration is at most %d", path,
            size, CFG_MAX_BYTES);
    return -1;
  }
  Source *src = src_from_file(path);
  if (!src) return -1;
  int rc = parse_and_walk(src, o);
  if (rc == 0) {
    shm_free(o->config_file);
    o->config_file = shm_strdup(path);
  }
  src_decref(src);
  return rc;
}

int cfg_load_default(ShmOptions *o) {
  char *path = cfg_default_path();
  if (!path) return 0;
  int rc = cfg_load(o, path, getenv("SHMAP_CONFIG") != NULL);
  shm_free(path);
  return rc;
}
