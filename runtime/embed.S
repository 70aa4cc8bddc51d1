/* Payloads compiled into the tupper binary so that one file is the whole
 * runtime: the static agent (PID 1 of every box), Debian's busybox-static
 * and its applet list (the embedded default image). */
#define TP_BLOB(name, path)            \
  .section .rodata;                    \
  .balign 16;                          \
  .global name##_start;                \
  .global name##_end;                  \
  name##_start:                        \
  .incbin path;                        \
  name##_end:                          \
  .byte 0

TP_BLOB(tp_blob_agent, TP_AGENT_PATH)
TP_BLOB(tp_blob_busybox, TP_BUSYBOX_PATH)
TP_BLOB(tp_blob_applets, TP_APPLETS_PATH)

.section .note.GNU-stack,"",@progbits
