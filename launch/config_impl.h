/* Private to launch/config*.c: the key table and the scalar setter shared by parsing (config.c)
 * and by to_yaml, the hash and sweeps (config_out.c). */
#ifndef MR_LAUNCH_CONFIG_IMPL_H
#define MR_LAUNCH_CONFIG_IMPL_H

#include <stddef.h>

#include "launch/config.h"

typedef enum kind { K_INT, K_NUM, K_BOOL, K_STR, K_ENUM, K_SIZES, K_CHANNELS, K_INPUT, K_DEVICES, K_PARAMS } kind;
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

/* The table entry for a dotted key, or NULL. */
const field *mr_cfg_find_field(const char *path);

/* Sets a single-valued key (int, number, bool, string, enum) from its text with every per-key
 * check; on error *e is unchanged and the message is positioned at p. */
mr_status mr_cfg_set_scalar(mr_experiment *e, const field *f, const char *s, pos p);

#endif
