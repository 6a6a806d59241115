/* Private to launch/config*.c: the key table and the scalar setter shared by parsing (config.c)
 * and by to_yaml, the hash and sweeps (config_out.c). */
#ifndef MR_LAUNCH_CONFIG_IMPL_H
#define MR_LAUNCH_CONFIG_IMPL_H

#include <stddef.h>

#include <yaml.h>

#include "launch/config.h"

typedef enum kind { K_INT, K_NUM, K_BOOL, K_STR, K_ENUM, K_SIZES, K_CHANNELS, K_INPUT, K_DEVICES, K_PARAMS, K_WINDOW, K_AUGMENT, K_SHAPE } kind;
enum { F_LO_EXCL = 1, F_HI_EXCL = 2, F_FILE = 4, F_RESUME = 8, F_NONEMPTY = 16 };

typedef struct field {
    const char *path;
    kind k;
    size_t off, size; /* size: bytes of a K_STR array */
    double lo, hi;
    int flags;
    const char *const *names; /* K_ENUM, NULL-terminated */
} field;

typedef struct pos {
    const char *name; /* file name, or "--set" */
    int line, col;    /* 1-based; line 0: no line (--set) */
} pos;

/* The key table, in to_yaml's order. */
extern const field mr_cfg_fields[];
extern const int mr_cfg_n_fields;

/* 1 when key f has no effect for e's choices (model.dropout unless model.type is gpt), with the
 * reason in why ("with model.type cnn (only gpt uses it)"); 0 when it applies. */
int mr_cfg_unused(const mr_experiment *e, const field *f, char *why, size_t cap);

/* The key that decides whether f applies (model.type for model.*, data.train.source for
 * data.train.*, ...), or NULL; and whether the sweep varies that key (then f applies to some
 * trials and is accepted). config_apply.c. */
const char *mr_cfg_selector_of(const field *f);
int mr_cfg_selector_swept(const mr_experiment *e, const field *f);

/* A YAML document being applied to an experiment (config.c). */
struct key_marks;
typedef struct walker {
    yaml_document_t *doc;
    const char *name;
    int is_set;               /* positions are "--set:col" */
    struct key_marks *marks;  /* NULL: not recorded */
} walker;

#define SCALAR(n) ((const char *)(n)->data.scalar.value)

/* The message is "<name>:<line>:<col>: ..." ("--set:<col>: ..." without a line; "<name>: ..."
 * when col is 0: no position known); the C position (file, line) goes apart (mr_last_error_where). */
mr_status mr_cfg_perr_at(const char *file, int line, mr_status s, pos p, const char *fmt, ...) MR_PRINTF(5, 6);
#define perr(...) mr_cfg_perr_at(__FILE__, __LINE__, __VA_ARGS__) /* (status, pos, fmt, ...) */
pos mr_cfg_node_pos(const walker *w, const yaml_node_t *n);
#define node_pos mr_cfg_node_pos
const char *mr_cfg_node_kind(const yaml_node_t *n); /* "a mapping", "a list", "a value" */
#define node_kind mr_cfg_node_kind
int mr_cfg_parse_i64(const char *s, int64_t *v); /* 1 when s is exactly an integer */
int mr_cfg_parse_f64(const char *s, double *v);  /* a finite number */
int mr_cfg_parse_bool(const char *s, int *v);    /* true/false, yes/no, on/off */
int mr_cfg_edit_distance(const char *a, const char *b); /* case-insensitive Levenshtein (99: too long) */

/* The model's structured keys (config_model.c): model.sizes, model.channels, model.input (a list
 * or tokens) and model.layers given as a list of layers (a layer graph); a scalar model.layers is
 * the gpt's depth, set like any integer. */
mr_status mr_cfg_set_model_node(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n);
/* log.trace: a step window [first, last] (1 <= first <= last), or [] / none / false: off (0 0). */
mr_status mr_cfg_set_window(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n);
/* data.train.augment (config_augment.c): a list of ops, or none; and its text for config.yaml. */
mr_status mr_cfg_set_augment(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n);
void mr_cfg_augment_text(const mr_augment_cfg *a, char *buf, size_t cap);
/* Checks a graph model's layers (mr_layers_check), the message at the failing layer's line. */
mr_status mr_cfg_check_layers(const mr_experiment *e, pos where) MR_WUR;

/* Data file keys (config_data.c): an F_FILE value that may be a glob or a '\n'-separated list must
 * name existing files (MR_ERR_NOT_FOUND); a YAML list for an F_FILE key becomes that list; the
 * required keys of d's source kind (nm: "data.train" or "data.eval"). */
mr_status mr_cfg_check_files(const field *f, const char *s, pos p);
mr_status mr_cfg_set_file_list(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n);
mr_status mr_cfg_check_source(const mr_data_cfg *d, const char *nm, pos p);
/* Defaults of the data file keys (x_dataset, features.*); the names of the feature dtypes. */
void mr_cfg_data_default(mr_data_cfg *d);
/* A K_SHAPE value (features.image.shape): a list of 1 to MR_CFG_MAX_SHAPE sizes >= 1, or [] (none). */
mr_status mr_cfg_set_shape(const walker *w, mr_experiment *e, const field *f, const yaml_node_t *n);
extern const char *const MR_CFG_IMAGE_DTYPES[], *const MR_CFG_LABEL_DTYPES[];

/* The table entry for a dotted key, or NULL. */
const field *mr_cfg_find_field(const char *path);

/* Sets a single-valued key (int, number, bool, string, enum) from its text with every per-key
 * check; on error *e is unchanged and the message is positioned at p. */
mr_status mr_cfg_set_scalar(mr_experiment *e, const field *f, const char *s, pos p);

#endif
