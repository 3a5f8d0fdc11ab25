#include "tessera/parallel/buckets.h"

#include "tessera/core/error.h"

namespace tessera::parallel {

std::vector<Bucket> make_buckets(const nn::UnitModel& model, double bucket_mb, int shards,
                                 std::vector<int>& bucket_of_unit) {
  const int first = model.first_unit(), last = model.last_unit();
  const int64_t target = static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4);
  std::vector<Bucket> buckets;
  bucket_of_unit.assign(last - first + 1, -1);
  int hi = last;
  while (hi >= first) {
    int lo = hi;
    auto begin = [&](int u) { return model.unit_begin(u); };
    while (lo > first && begin(hi + 1) - begin(lo) < target) --lo;
    Bucket b;
    b.first_unit = lo;
    b.last_unit = hi;
    b.begin = begin(lo);
    b.end = begin(hi + 1);
    if (b.size() == 0) {  // none of the set's parameters live in these units (a GPT's experts)
      hi = lo - 1;
      continue;
    }
    auto [fp, lp] = model.params().params_in(b.begin, b.end);
    b.first_param = fp;
    b.last_param = lp;
    TESSERA_ASSERT(shards == 0 || b.size() % shards == 0, "a bucket of ", b.size(),
                   " elements does not split into ", shards,
                   " shards; the model must be built with flat_layout_for()");
    b.shard = shards > 0 ? b.size() / shards : 0;
    b.users = hi - lo + 1;
    for (int u = lo; u <= hi; ++u) bucket_of_unit[u - first] = static_cast<int>(buckets.size());
    buckets.push_back(std::move(b));
    hi = lo - 1;
  }
  for (int u = first; u <= last; ++u) {
    const int tied = model.tied_unit(u);
    if (tied >= 0 && bucket_of_unit[tied - first] != bucket_of_unit[u - first])
      ++buckets[bucket_of_unit[tied - first]].users;
  }
  return buckets;
}

}  // namespace tessera::parallel
