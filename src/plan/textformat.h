/* Protobuf text format for any protobuf-c message, driven by its descriptor
 * (no parser per field). The printer writes exactly what `protoc --decode`
 * prints; the parser reads what `protoc --encode` reads (fields by name,
 * `:` optional before messages, `{}` or `<>`, `[a, b]` lists, # comments). */
#ifndef LOOM_TEXTFORMAT_H
#define LOOM_TEXTFORMAT_H

#include <protobuf-c/protobuf-c.h>
#include "core/status.h"

/* The message as text; the caller frees it. */
char *loom_text_print(const ProtobufCMessage *msg);
/* Parses text into a new message of `desc` (free it with
 * protobuf_c_message_free_unpacked). Errors name the line and the field. */
loom_status loom_text_parse(const ProtobufCMessageDescriptor *desc, const char *text, size_t len,
                            ProtobufCMessage **out, loom_error *err);

#endif
