#pragma once
// libjpeg's error handling for the decoder and the encoder: libjpeg reports
// an error through a callback that must not return, so the callback here
// jumps back to the setjmp of the call that started the work, with the
// message kept. A function that calls setjmp must hold no C++ object with a
// destructor in its own frame, so that the jump skips nothing needing to run.
#include <csetjmp>
#include <cstdio>

// jpeglib.h needs FILE and size_t declared first.
#include <jerror.h>
#include <jpeglib.h>

namespace mix::data {

struct LibjpegErrorJump {
  jpeg_error_mgr mgr;  // first: libjpeg sees a jpeg_error_mgr*
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
};

/// libjpeg's error_exit: keeps the message and jumps to LibjpegErrorJump::jump.
[[noreturn]] inline void libjpeg_jump_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<LibjpegErrorJump*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

/// Points cinfo's error manager at `err`, errors jumping (call before jpeg_create_*).
template <typename Cinfo>
void use_error_jump(Cinfo& cinfo, LibjpegErrorJump& err) {
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = libjpeg_jump_on_error;
}

}  // namespace mix::data
