#include <fmt/format.h>
#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "shard/rank_table.hpp"

// Random operations against a deliberately naive model of the contract; the real table
// must agree with it on every answer and keep its invariants after every operation.
namespace metad::shard {
namespace {

struct model_rank {
  struct held {
    std::int64_t page;
    bool confirmed;
    std::uint64_t deadline = 0;  // of a reservation
  };
  std::int64_t num_pages = 0;
  std::map<std::string, held, std::less<>> keys;
  std::deque<std::pair<std::uint64_t, std::int64_t>> quarantine;  // {until, page}, oldest first

  std::set<std::int64_t> used() const {
    std::set<std::int64_t> s;
    for (const auto& [k, h] : keys) s.insert(h.page);
    for (const auto& q : quarantine) s.insert(q.second);
    return s;
  }
  std::int64_t free_count() const { return num_pages - static_cast<std::int64_t>(keys.size()); }
  rank_stats stats() const {
    std::int64_t bound = 0;
    for (const auto& [k, h] : keys) bound += h.confirmed;
    return {num_pages, free_count(), static_cast<std::int64_t>(keys.size()) - bound, bound};
  }

  void allocate(const std::vector<std::string_view>& in, std::uint64_t deadline,
                std::vector<std::uint32_t>& distinct, std::vector<std::int64_t>& pages) {
    std::vector<std::string_view> fresh;
    for (std::uint32_t i = 0; i < in.size(); ++i) {
      bool dup = false;
      for (auto j : distinct) dup |= in[j] == in[i];
      if (dup) continue;
      distinct.push_back(i);
      auto it = keys.find(in[i]);
      pages.push_back(it == keys.end() ? -1 : it->second.page);
      if (it == keys.end()) fresh.push_back(in[i]);
    }
    if (static_cast<std::int64_t>(fresh.size()) > free_count()) return;
    for (std::size_t k = 0; k < distinct.size(); ++k) {
      if (pages[k] != -1) continue;
      const auto u = used();
      std::int64_t p = 0;
      while (u.count(p)) ++p;
      if (p == num_pages) {  // nothing free: the oldest quarantined page
        p = quarantine.front().second;
        quarantine.pop_front();
      }
      keys[std::string(in[distinct[k]])] = {p, false, deadline};
      pages[k] = p;
    }
  }

  confirm_outcome confirm(std::int64_t rank, const std::vector<std::string_view>& in,
                          const std::vector<std::int64_t>& pages,
                          const std::vector<std::int64_t>& releases, std::uint64_t until,
                          std::string& detail, std::vector<std::uint32_t>& newly,
                          std::uint64_t& refused) {
    for (std::size_t i = 0; i < in.size(); ++i) {
      const auto p = pages[i];
      if (p < 0 || p >= num_pages) {
        detail = fmt::format("Page {} out of range for rank {} (num_pages {})", p, rank, num_pages);
        return confirm_outcome::bad_request;
      }
      auto it = keys.find(in[i]);
      if (it != keys.end() && it->second.page == p) continue;
      for (std::size_t j = 0; j < i; ++j) {
        if (pages[j] == p && in[j] != in[i]) {
          detail = fmt::format("Page {} confirmed for two different keys", p);
          return confirm_outcome::bad_request;
        }
      }
      detail = fmt::format("Page {} is not reserved for key {} on rank {}", p, in[i], rank);
      return confirm_outcome::bad_request;
    }
    for (auto p : releases) {
      if (p < 0 || p >= num_pages) {
        detail = fmt::format("Page {} in pages_to_release out of range for rank {} (num_pages {})",
                             p, rank, num_pages);
        return confirm_outcome::bad_request;
      }
    }
    for (std::uint32_t i = 0; i < in.size(); ++i) {
      auto& h = keys.find(in[i])->second;
      if (!h.confirmed) newly.push_back(i);
      h.confirmed = true;
    }
    for (auto p : releases) {
      for (auto it = keys.begin(); it != keys.end(); ++it) {
        if (it->second.page != p) continue;
        if (it->second.confirmed) {
          ++refused;
        } else {
          keys.erase(it);
          if (until != 0) quarantine.emplace_back(until, p);
        }
        break;
      }
    }
    return confirm_outcome::ok;
  }
};

// Reservations whose deadline came, in no particular order.
std::size_t expire(model_rank& m, std::uint64_t now) {
  std::size_t n = 0;
  for (auto it = m.keys.begin(); it != m.keys.end();) {
    if (!it->second.confirmed && it->second.deadline <= now) {
      it = m.keys.erase(it);
      ++n;
    } else {
      ++it;
    }
  }
  return n;
}

// Quarantines whose time came, oldest first.
std::vector<std::int64_t> end_quarantines(model_rank& m, std::uint64_t now) {
  std::vector<std::int64_t> ended;
  while (!m.quarantine.empty() && m.quarantine.front().first <= now) {
    ended.push_back(m.quarantine.front().second);
    m.quarantine.pop_front();
  }
  return ended;
}

// How often each confirm answer occurred, so the test can insist it exercised them all.
struct coverage {
  std::map<std::string, int> answers;
  void note(confirm_outcome outcome, const std::string& detail) {
    if (outcome == confirm_outcome::ok) {
      ++answers["ok"];
    } else if (detail.find("pages_to_release") != std::string::npos) {
      ++answers["release out of range"];
    } else if (detail.find("out of range") != std::string::npos) {
      ++answers["page out of range"];
    } else if (detail.find("two different keys") != std::string::npos) {
      ++answers["two keys"];
    } else if (detail.find("not reserved") != std::string::npos) {
      ++answers["not reserved"];
    }
  }
};

// quarantine: how long a released page waits (0: free at once).
void run_random(std::uint32_t seed, int steps, std::uint64_t quarantine, coverage& cov) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  rank_table table;
  constexpr std::uint64_t ttl = 60;
  table.set_reservation_ttl(ttl);
  std::uint64_t now = 1000;
  std::map<std::int64_t, model_rank> model;
  std::uint64_t refused = 0;
  std::vector<std::string> universe;
  for (int i = 0; i < 48; ++i) universe.push_back(fmt::format("{:032x}", i * 2654435761u));
  const std::int64_t ranks[] = {-2, 0, 7};
  for (auto r : ranks) {
    const std::int64_t n = 1 + pick(70);
    table.initialize(r, n);
    model[r].num_pages = n;
  }
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(fmt::format("seed {} step {}", seed, step));
    const std::int64_t rank = ranks[pick(3)];
    model_rank& m = model[rank];
    const int op = pick(100);
    now += static_cast<std::uint64_t>(pick(3));
    std::vector<std::string_view> keys;
    for (int n = pick(12); n > 0; --n) keys.push_back(universe[pick(48)]);
    if (op < 36) {
      std::vector<std::uint32_t> d1, d2;
      std::vector<std::int64_t> p1, p2;
      ASSERT_TRUE(table.allocate(rank, keys, now, d1, p1));
      m.allocate(keys, now + ttl, d2, p2);
      ASSERT_EQ(d1, d2);
      ASSERT_EQ(p1, p2);
    } else if (op < 40) {
      // The end of quarantines, then expiry, on every rank at once, as a core's tick does.
      std::map<std::int64_t, std::vector<std::int64_t>> ended;
      for (auto& [r, mr] : model)
        if (auto e = end_quarantines(mr, now); !e.empty()) ended[r] = e;
      std::map<std::int64_t, std::vector<std::int64_t>> reported_ends;
      table.end_quarantines(now, [&](std::int64_t r, std::span<const std::int64_t> pages) {
        reported_ends[r].assign(pages.begin(), pages.end());
      });
      ASSERT_EQ(reported_ends, ended);
      for (auto& [r, e] : ended) cov.answers["quarantine ended"] += static_cast<int>(e.size());
      std::size_t want = 0;
      for (auto& entry : model) want += expire(entry.second, now);
      std::size_t reported = 0;
      const std::size_t got =
          table.expire(now, [&](std::int64_t r, std::span<const std::int64_t> pages) {
            ASSERT_FALSE(pages.empty());
            ASSERT_TRUE(model.count(r));
            reported += pages.size();
          });
      ASSERT_EQ(got, want);
      ASSERT_EQ(reported, want);
      cov.answers["expired"] += static_cast<int>(got);
    } else if (op < 44) {
      // Delete / eviction on this rank: confirmed keys go, reservations stay.
      std::vector<std::uint32_t> removed, want;
      ASSERT_TRUE(table.remove_confirmed(rank, keys, removed));
      for (std::uint32_t i = 0; i < keys.size(); ++i) {
        auto it = m.keys.find(keys[i]);
        if (it == m.keys.end() || !it->second.confirmed) continue;
        m.keys.erase(it);
        want.push_back(i);
      }
      ASSERT_EQ(removed, want);
      cov.answers["removed"] += static_cast<int>(removed.size());
    } else if (op < 90) {
      // Mostly plausible confirmations (the page the key holds), some corrupted.
      std::vector<std::int64_t> pages, releases;
      for (auto k : keys) {
        auto it = m.keys.find(k);
        std::int64_t p = it != m.keys.end() ? it->second.page : pick(static_cast<int>(m.num_pages));
        if (pick(20) == 0) p = pick(static_cast<int>(m.num_pages) + 2);
        pages.push_back(p);
      }
      if (pick(3) == 0) {
        keys.clear();
        pages.clear();
      }
      for (int n = pick(4); n > 0; --n) {
        releases.push_back(pick(static_cast<int>(m.num_pages) + (pick(30) == 0 ? 3 : 0)));
      }
      std::string detail1, detail2;
      std::vector<std::uint32_t> newly1, newly2;
      const std::uint64_t until = quarantine == 0 ? 0 : now + quarantine;
      const auto got = table.confirm(rank, keys, pages, releases, until, detail1, newly1);
      const auto want = m.confirm(rank, keys, pages, releases, until, detail2, newly2, refused);
      ASSERT_EQ(got, want) << detail1;
      ASSERT_EQ(detail1, detail2);
      ASSERT_EQ(newly1, newly2);
      cov.note(got, detail1);
      ASSERT_EQ(table.refused_releases(), refused);
    } else if (op < 97) {
      std::vector<std::int64_t> got(keys.size());
      ASSERT_TRUE(table.confirmed_pages(rank, keys, got));
      for (std::size_t i = 0; i < keys.size(); ++i) {
        auto it = m.keys.find(keys[i]);
        ASSERT_EQ(got[i], it != m.keys.end() && it->second.confirmed ? it->second.page : -1);
      }
    } else {
      const std::int64_t n = m.num_pages + pick(70) - 20;
      if (n <= 0) continue;
      std::vector<std::string> unbound;
      const auto r = table.initialize(rank, n, &unbound);
      ASSERT_EQ(r.old_pages, m.num_pages);
      if (n > m.num_pages) {
        ASSERT_EQ(r.outcome, init_outcome::grown);
      } else if (n == m.num_pages) {
        ASSERT_EQ(r.outcome, init_outcome::unchanged);
      } else {
        ASSERT_EQ(r.outcome, init_outcome::shrunk);
        std::set<std::string> want;
        for (auto it = m.keys.begin(); it != m.keys.end();) {
          if (it->second.page < n) {
            ++it;
            continue;
          }
          if (it->second.confirmed) want.insert(it->first);
          it = m.keys.erase(it);
        }
        std::erase_if(m.quarantine, [&](const auto& q) { return q.second >= n; });
        ASSERT_EQ(std::set<std::string>(unbound.begin(), unbound.end()), want);
        cov.answers["shrunk"] += 1;
      }
      m.num_pages = n;
    }
    const auto s = table.stats(rank);
    const auto w = m.stats();
    ASSERT_EQ(s->num_pages, w.num_pages);
    ASSERT_EQ(s->free, w.free);
    ASSERT_EQ(s->reserved, w.reserved);
    ASSERT_EQ(s->bound, w.bound);
    ASSERT_EQ(table.verify(), "");
  }
}

TEST(RankTableRandom, AgreesWithModelAndKeepsInvariants) {
  coverage cov;
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    run_random(seed, 2500, seed % 2 == 0 ? 0 : 40, cov);
    if (HasFatalFailure()) return;
  }
  for (const char* answer : {"ok", "release out of range", "page out of range", "two keys",
                             "not reserved", "expired", "removed", "quarantine ended", "shrunk"}) {
    EXPECT_GT(cov.answers[answer], 0) << answer;
  }
  for (const auto& [answer, n] : cov.answers) std::printf("  %-22s %d\n", answer.c_str(), n);
}

}  // namespace
}  // namespace metad::shard
