#include "server/exchange.hpp"

#include "http/response.hpp"
#include "server/endpoints.hpp"

namespace server {

exchange::exchange(cluster& cl, core_state& home, net::waker& waker)
    : cluster_(cl),
      home_(home),
      waker_(waker),
      parser_(http::limits{cl.cfg.header_bytes_max, cl.cfg.body_bytes_max}) {}

net::flow exchange::on_bytes(std::size_t bytes) {
  parser_.commit(bytes);
  return advance();
}

net::flow exchange::on_resume() {
  parser_.consume();
  if (!keep_alive_) return net::flow::close;
  return advance();
}

net::flow exchange::advance() {
  for (;;) {
    switch (parser_.next()) {
      case http::parse_status::need_more:
        if (parser_.take_continue_request())
          out_.append(http::canned_bytes(http::canned::continue_100, true));
        return net::flow::read;
      case http::parse_status::error:
        out_.append(http::parse_error_bytes(parser_.error()));
        return net::flow::close;
      case http::parse_status::ready:
        break;
    }
    const http::request& request = parser_.current();
    keep_alive_ = request.keep_alive && !request.http_1_0;  // spec: 1.0 is answered, then closed
    in_flight_ = true;
    dispatch(request);
    if (in_flight_) {  // the endpoint is running on other cores
      parked_ = true;
      return net::flow::wait;
    }
    parser_.consume();
    if (!keep_alive_) return net::flow::close;
  }
}

void exchange::complete() {
  in_flight_ = false;
  if (parked_) {
    parked_ = false;
    waker_.wake();
  }
}

void exchange::respond_json(int status, std::string_view body) {
  http::append_json(out_, status, body, keep_alive_);
}

void exchange::respond_error(int status, std::string_view detail) {
  scratch_.body.clear();
  api::encode_error(scratch_.body, detail);
  http::append_json(out_, status, scratch_.body, keep_alive_);
}

void exchange::respond_canned(http::canned what) {
  out_.append(http::canned_bytes(what, keep_alive_));
}

// Routes and decodes on the home core; anything that touches state runs as an endpoint
// coroutine. Answers that need no state are written here and complete at once.
void exchange::dispatch(const http::request& request) {
  const http::route route = http::match(request.verb, request.target);
  api::decoder& decoder = home_.decoder;
  scratch& s = scratch_;
  api::error err;
  switch (route.target) {
    case http::endpoint::initialize:
      err = decoder.decode_initialize(route.rank_text, request.body,
                                      cluster_.cfg.pages_per_rank_max, s.init);
      if (err) break;
      if (s.init.kind == api::init_kind::scheduler) {
        respond_canned(http::canned::scheduler_initialized);
        return complete();
      }
      if (s.init.kind == api::init_kind::invalid_parameters) {
        respond_canned(http::canned::invalid_initialization);
        return complete();
      }
      run_initialize(*this);
      return;
    case http::endpoint::batch_allocate:
      if (!(err = decoder.decode_allocate(request.body, s.allocate))) run_allocate(*this);
      break;
    case http::endpoint::confirm_write:
      if (!(err = decoder.decode_confirm(request.body, s.confirm))) run_confirm(*this);
      break;
    case http::endpoint::batch_exists:
      if (!(err = decoder.decode_exists(request.body, s.exists))) run_lookup(*this, false);
      break;
    case http::endpoint::get_locations:
      if (!(err = decoder.decode_locations(request.body, s.locations))) run_lookup(*this, true);
      break;
    case http::endpoint::clear:
      run_clear(*this);
      return;
    case http::endpoint::rank_info:
      if (!api::parse_rank(route.rank_text, s.init.rank)) {
        respond_canned(http::canned::invalid_rank_in_path);
        return complete();
      }
      run_rank_info(*this);
      return;
    case http::endpoint::not_found:
      respond_canned(http::canned::not_found);
      return complete();
    case http::endpoint::method_not_allowed:
      respond_canned(http::canned::method_not_allowed);
      return complete();
    case http::endpoint::method_not_allowed_get:
      respond_canned(http::canned::method_not_allowed_get);
      return complete();
  }
  if (err) {
    respond_error(err.status, err.detail);
    complete();
  }
}

}  // namespace server
