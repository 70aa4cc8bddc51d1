/* The one table of backends.  A new backend is a folder of its own under
 * backends/ (its vtable, `const tp_backend_t tp_backend_<name>`), one
 * add_subdirectory line in backends/CMakeLists.txt and one line here. */
#include <string.h>

#include "backend.h"

#define TP__BACKENDS(X) \
  X(linux)              \
  X(microvm)

#define TP__DECLARE(n) extern const tp_backend_t tp_backend_##n;
TP__BACKENDS(TP__DECLARE)

#define TP__ENTRY(n) &tp_backend_##n,
static const tp_backend_t *const tp__backends[] = {TP__BACKENDS(TP__ENTRY) NULL};

#define TP__NAME(n) #n,
static const char *const tp__names[] = {TP__BACKENDS(TP__NAME) NULL};

const tp_backend_t *tp_backend_find(const char *name) {
  if (name == NULL)
    return NULL;
  for (size_t i = 0; tp__backends[i] != NULL; i++)
    if (strcmp(tp__backends[i]->name, name) == 0)
      return tp__backends[i];
  return NULL;
}

const char *const *tp_backend_names(void) { return tp__names; }
