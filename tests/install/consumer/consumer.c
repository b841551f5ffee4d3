/* Uses the installed C ABI: prints the library's version, then checks that a call without tensors is
   refused with FLASHGEN_ERROR_INVALID_ARGUMENT and a message (no GPU needed). Exit 0 on success. */
#include <flashgen/flashgen.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  printf("%s\n", flashgen_version());
  flashgen_attention_options options;
  memset(&options, 0, sizeof(options));
  int status = flashgen_attention_forward(NULL, NULL, NULL, NULL, NULL, &options, NULL);
  if (status != FLASHGEN_ERROR_INVALID_ARGUMENT || strstr(flashgen_last_error(), "null pointer") == NULL) {
    fprintf(stderr, "expected an invalid-argument error on a null pointer, got status %d: %s\n", status,
            flashgen_last_error());
    return 1;
  }
  return 0;
}
