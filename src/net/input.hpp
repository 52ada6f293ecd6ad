// Whether a connected socket holds bytes nobody has read yet. Both transports ask while
// stopping: such bytes are requests the client sent before it could know, and they are
// served before the connection closes. Any core, any socket; never blocks.
#pragma once

#include <sys/socket.h>

namespace metad::net {

inline bool input_waiting(int fd) {
  char byte = 0;
  return ::recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

}  // namespace metad::net
