// What an endpoint answers, and the coroutine type of the endpoints that hop. An
// endpoint returns its answer; the connection writes it and completes the request
// (connection::finish, the one place that does), so no path of an endpoint can leave its
// connection waiting. Home core only.
#pragma once

#include <coroutine>
#include <cstdint>
#include <exception>
#include <string_view>

#include "http/response.hpp"
#include "smp/request_task.hpp"

namespace metad::pipeline {

class connection;

// A status and a body, or a fixed answer, or "later". Its text is a view (of the
// connection's scratch, or of a constant) that must live until the connection writes
// it: nothing is copied or allocated.
class answer {
 public:
  // A precomputed answer (http/response.hpp).
  static answer canned(http::canned what) { return {kind::canned, what, 0, {}}; }
  // A JSON body.
  static answer json(int status, std::string_view body) { return {kind::json, {}, status, body}; }
  // {"detail": detail}, as FastAPI answers errors.
  static answer error(int status, std::string_view detail) {
    return {kind::error, {}, status, detail};
  }
  // Prometheus text (GET /metrics).
  static answer metrics(std::string_view text) { return {kind::metrics, {}, 200, text}; }
  // The status page (GET /): constant HTML, with headers that keep it self-contained.
  static answer html(std::string_view page) { return {kind::html, {}, 200, page}; }
  // A whole response, as is (the parser's errors: they close the connection).
  static answer raw(std::string_view bytes) { return {kind::raw, {}, 0, bytes}; }
  // An endpoint coroutine has the request: it answers when it co_returns.
  static answer later() { return {kind::later, {}, 0, {}}; }

  bool is_later() const { return kind_ == kind::later; }

 private:
  enum class kind : std::uint8_t { later, canned, json, error, metrics, html, raw };
  answer(kind k, http::canned what, int status, std::string_view text)
      : kind_(k), canned_(what), status_(status), text_(text) {}

  kind kind_;
  http::canned canned_;
  int status_;
  std::string_view text_;
  friend class connection;
};

// An endpoint that hops (endpoints.cpp): a coroutine whose first parameter is its
// connection. It starts on the connection's home core, with its command decoded into
// connection::work(), and co_returns its answer back home. Its start function returns it
// as answer::later(). Frames come from the core's frame pool.
class endpoint_task {
 public:
  struct promise_type {
    template <typename... Args>
    explicit promise_type(connection& x, Args&&...) noexcept : x(x) {}
    endpoint_task get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_value(const answer& a);  // connection::finish (connection.cpp)
    void unhandled_exception() noexcept { std::terminate(); }
    static void* operator new(std::size_t bytes) { return smp::frame_pool::allocate(bytes); }
    static void operator delete(void* frame, std::size_t bytes) noexcept {
      smp::frame_pool::release(frame, bytes);
    }

    connection& x;
  };
  // What the start function answers: the coroutine answers when it ends.
  operator answer() const { return answer::later(); }  // NOLINT: implicit on purpose
};

}  // namespace metad::pipeline
