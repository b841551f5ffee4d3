/* Uses the installed C ABI: prints the library's version, then checks that a call without tensors is
   refused with FLASHGEN_ERROR_INVALID_ARGUMENT and a message naming a null pointer, and one whose options do not
   carry their size is refused naming opts.size (no GPU needed). Exit 0 on success. */
#include <flashgen/flashgen.h>
#include <stdio.h>
#include <string.h>

/* The call refused with FLASHGEN_ERROR_INVALID_ARGUMENT and a message holding `expected`. */
static int refused(int status, const char* expected) {
  if (status == FLASHGEN_ERROR_INVALID_ARGUMENT && strstr(flashgen_last_error(), expected) != NULL) return 1;
  fprintf(stderr, "expected an invalid-argument error naming '%s', got status %d: %s\n", expected, status,
          flashgen_last_error());
  return 0;
}

int main(void) {
  printf("%s\n", flashgen_version());
  flashgen_attention_options options = FLASHGEN_ATTENTION_OPTIONS_INIT;
  if (!refused(flashgen_attention_forward(NULL, NULL, NULL, NULL, NULL, &options, NULL), "null pointer")) return 1;
  memset(&options, 0, sizeof(options));
  if (!refused(flashgen_attention_forward(NULL, NULL, NULL, NULL, NULL, &options, NULL), "opts.size is 0")) return 1;
  return 0;
}
