// SVG pictures: a schedule's timeline has one box per computation, a trace's timeline leaves the
// idle spans out and measures the bubble, loss curves have one line per series; every document
// is well-formed XML (checked by a small parser here, independent of the writer).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/core/trace.h"
#include "tessera/parallel/pipeline/schedule_generators.h"
#include "tessera/parallel/pipeline/schedule_simulate.h"
#include "train_fixture.h"
#include "viz/metrics_series.h"
#include "viz/plot_curves.h"
#include "viz/plot_timeline.h"
#include "viz/svg.h"
#include "viz/timeline.h"
#include "viz/trace_timeline.h"

namespace tessera::viz {
namespace {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // character data directly inside (unescaped entities left as they are)
};

// A minimal XML reader: the prolog, nested elements with quoted attributes, character data
// without '<' or bare '&'. Fails the test (and returns what it read) on anything malformed.
std::vector<Element> parse_xml(const std::string& doc) {
  std::vector<Element> out;
  std::vector<std::string> open;
  std::vector<size_t> open_index;
  size_t i = 0;
  if (doc.rfind("<?xml", 0) == 0) i = doc.find("?>") + 2;
  bool root_seen = false;
  while (i < doc.size()) {
    const size_t lt = doc.find('<', i);
    const std::string chars = doc.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    for (size_t k = 0; k < chars.size(); ++k)
      if (chars[k] == '&') {
        const size_t semi = chars.find(';', k);
        EXPECT_NE(semi, std::string::npos) << "bare & in: " << chars;
        if (semi == std::string::npos) return out;
        const std::string entity = chars.substr(k, semi - k + 1);
        EXPECT_TRUE(entity == "&amp;" || entity == "&lt;" || entity == "&gt;" ||
                    entity == "&quot;" || entity == "&apos;")
            << entity;
      }
    if (!open.empty()) out[open_index.back()].text += chars;
    if (lt == std::string::npos) break;
    const size_t gt = doc.find('>', lt);
    EXPECT_NE(gt, std::string::npos) << "unterminated tag at " << lt;
    if (gt == std::string::npos) return out;
    std::string tag = doc.substr(lt + 1, gt - lt - 1);
    i = gt + 1;
    if (tag[0] == '/') {
      EXPECT_FALSE(open.empty()) << "closing " << tag << " with nothing open";
      if (open.empty()) return out;
      EXPECT_EQ(tag.substr(1), open.back()) << "mismatched closing tag";
      open.pop_back();
      open_index.pop_back();
      continue;
    }
    const bool self_closing = tag.back() == '/';
    if (self_closing) tag.pop_back();
    Element e;
    size_t p = tag.find_first_of(" \n");
    e.name = tag.substr(0, p);
    while (p != std::string::npos && p < tag.size()) {
      p = tag.find_first_not_of(" \n", p);
      if (p == std::string::npos) break;
      const size_t eq = tag.find('=', p);
      EXPECT_NE(eq, std::string::npos) << "attribute without value in <" << tag << ">";
      if (eq == std::string::npos || eq + 1 >= tag.size() || tag[eq + 1] != '"') {
        ADD_FAILURE() << "unquoted attribute in <" << tag << ">";
        return out;
      }
      const size_t close = tag.find('"', eq + 2);
      EXPECT_NE(close, std::string::npos);
      if (close == std::string::npos) return out;
      const std::string name = tag.substr(p, eq - p);
      EXPECT_EQ(e.attrs.count(name), 0u) << "duplicate attribute " << name;
      e.attrs[name] = tag.substr(eq + 2, close - eq - 2);
      EXPECT_EQ(e.attrs[name].find('<'), std::string::npos);
      p = close + 1;
    }
    if (open.empty()) {
      EXPECT_FALSE(root_seen) << "two root elements";
      root_seen = true;
    }
    out.push_back(e);
    if (!self_closing) {
      open.push_back(e.name);
      open_index.push_back(out.size() - 1);
    }
  }
  EXPECT_TRUE(open.empty()) << "unclosed <" << (open.empty() ? "" : open.back()) << ">";
  EXPECT_TRUE(root_seen);
  return out;
}

size_t count(const std::vector<Element>& els, const std::string& name,
             const std::string& css_class = "") {
  size_t n = 0;
  for (const Element& e : els)
    if (e.name == name &&
        (css_class.empty() || (e.attrs.count("class") && e.attrs.at("class") == css_class)))
      ++n;
  return n;
}

bool has_text(const std::vector<Element>& els, const std::string& needle) {
  for (const Element& e : els)
    if (e.name == "text" && e.text.find(needle) != std::string::npos) return true;
  return false;
}

TEST(Svg, EscapingNumbersAndTicks) {
  EXPECT_EQ(xml_escape("a<b & \"c\" 'd'>"), "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;");
  EXPECT_EQ(format_number(0.25), "0.25");
  EXPECT_EQ(format_number(12), "12");
  EXPECT_EQ(format_number(-1e-15), "0");
  EXPECT_EQ(nice_ticks(0, 33, 6), (std::vector<double>{0, 5, 10, 15, 20, 25, 30}));
  const std::vector<double> t = nice_ticks(4.2, 5.7, 6);
  ASSERT_EQ(t.size(), 8u);  // 4.2, 4.4, ..., 5.6: the count nearest 6 of steps 0.1, 0.2, 0.5, 1
  EXPECT_DOUBLE_EQ(t[0], 4.2);
  EXPECT_DOUBLE_EQ(t[7], 5.6);
  Svg svg(10, 10);
  svg.text(1, 2, "x < y & z", 12, "start", "#000", true, -90);
  svg.rect(0, 0, 1, 1, "#fff", "tip <here>", "#000", "box");
  const auto els = parse_xml(svg.str());
  EXPECT_EQ(count(els, "rect", "box"), 1u);
  EXPECT_TRUE(has_text(els, "x &lt; y &amp; z"));
}

// One <rect class="box"> per computation, labelled by micro-batch; the title carries the bubble;
// the per-row idle shares equal the simulator's.
TEST(PlotTimeline, ScheduleHasOneBoxPerAction) {
  struct Case {
    const char* name;
    int v;
    size_t boxes;  // p * m * v * (2, or 3 with BI and W)
    const char* bubble;
  };
  for (const Case c : {Case{"gpipe", 1, 64, "27.3%"}, Case{"1f1b", 1, 64, "27.3%"},
                       Case{"interleaved", 2, 128, "15.8%"}, Case{"zb-h1", 1, 96, "11.1%"}}) {
    const parallel::Schedule s =
        parallel::make_schedule(parallel::parse_schedule(c.name), 4, 8, c.v);
    const parallel::ActionCosts costs;
    const parallel::Simulation sim = parallel::simulate(s, costs);
    const Timeline t = timeline_from_simulation(s, sim, costs);
    ASSERT_EQ(t.rows.size(), 4u);
    const std::vector<double> rb = row_bubbles(t);
    for (size_t r = 0; r < 4; ++r) EXPECT_NEAR(rb[r], sim.bubble[r], 1e-12) << c.name << r;
    EXPECT_NEAR(overall_bubble(t), sim.bubble_overall, 1e-12);
    const std::string doc = timeline_svg(t);
    const auto els = parse_xml(doc);
    ASSERT_FALSE(els.empty());
    EXPECT_EQ(els[0].name, "svg");
    EXPECT_EQ(count(els, "rect", "box"), c.boxes) << c.name;
    EXPECT_EQ(count(els, "rect", "comm"), 0u);
    EXPECT_TRUE(has_text(els, std::string("bubble ") + c.bubble)) << c.name;
    EXPECT_TRUE(has_text(els, "rank 3"));
    EXPECT_TRUE(has_text(els, "time (cost units)"));
    // Every micro-batch label appears inside boxes, and each box has a tooltip.
    for (int m = 0; m < 8; ++m) {
      size_t labels = 0;
      for (const Element& e : els)
        if (e.name == "text" && e.text == std::to_string(m)) ++labels;
      EXPECT_GE(labels, c.boxes / 8) << c.name << " micro-batch " << m;
    }
    EXPECT_EQ(count(els, "title"), c.boxes);
  }
}

std::string sample_trace() {
  // Rank 0: forward [0, 100) us, idle, backward [300, 500); a comm span [100, 300) on track 1.
  // Rank 1: forward [100, 200), backward [200, 400), the optimizer [400, 500).
  std::vector<TraceEvent> r0 = {{"F0", "forward", 0, 0, 100},
                                {"B0", "backward", 0, 300, 200},
                                {"all_reduce", "comm", 1, 100, 200}};
  std::vector<TraceEvent> r1 = {{"F0", "forward", 0, 100, 100},
                                {"B0", "backward", 0, 200, 200},
                                {"optimizer step", "optimizer", 0, 400, 100}};
  return chrome_trace_json({{0, with_idle_spans(r0)}, {1, with_idle_spans(r1)}});
}

TEST(PlotTimeline, ChromeTraceLeavesIdleOut) {
  const Timeline t = timeline_from_chrome_trace(sample_trace(), "/some/dir/run.json");
  EXPECT_EQ(t.time_unit, "ms");
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.rows[0].name, "rank 0");
  ASSERT_EQ(t.rows[0].boxes.size(), 2u);  // the idle span [100, 300) is not a box
  EXPECT_EQ(t.rows[0].boxes[1].kind, BoxKind::Backward);
  EXPECT_DOUBLE_EQ(t.rows[0].boxes[1].start, 0.3);
  EXPECT_DOUBLE_EQ(t.rows[0].boxes[1].end, 0.5);
  ASSERT_EQ(t.rows[0].comm.size(), 1u);
  EXPECT_EQ(t.rows[1].boxes[2].kind, BoxKind::Other);
  // Over [0, 0.5] ms rank 0 computes 0.3 ms, rank 1 0.4 ms.
  const std::vector<double> rb = row_bubbles(t);
  EXPECT_NEAR(rb[0], 0.4, 1e-12);
  EXPECT_NEAR(rb[1], 0.2, 1e-12);
  EXPECT_EQ(t.title, "run.json: bubble 30.0% (idle share of the compute tracks)");
  const auto els = parse_xml(timeline_svg(t));
  EXPECT_EQ(count(els, "rect", "box"), 5u);
  EXPECT_EQ(count(els, "rect", "comm"), 1u);
  EXPECT_TRUE(has_text(els, "time (ms)"));

  // A communication span the compute track blocks in (a pipeline receive) and a wait (for an
  // expert exchange) are idle time too.
  std::vector<TraceEvent> p0 = {{"F0", "forward", 2, 0, 100},
                                {"recv B0", "comm", 2, 100, 200},
                                {"wait for combine", "wait", 0, 300, 100},
                                {"B0", "backward", 2, 400, 100}};
  const Timeline pt = timeline_from_chrome_trace(chrome_trace_json({{0, p0}}), "pp.json");
  ASSERT_EQ(pt.rows.size(), 1u);
  EXPECT_EQ(pt.rows[0].boxes.size(), 4u);       // drawn
  EXPECT_NEAR(row_bubbles(pt)[0], 0.6, 1e-12);  // but not busy
  EXPECT_EQ(pt.title, "pp.json: bubble 60.0% (idle share of the compute tracks)");

  // A window cuts spans at its edges and measures the bubble inside it.
  const Timeline w = timeline_from_chrome_trace(sample_trace(), "run.json", TraceWindow{0.2, 0.45});
  ASSERT_EQ(w.rows[0].boxes.size(), 1u);
  EXPECT_DOUBLE_EQ(w.rows[0].boxes[0].start, 0.3);
  EXPECT_DOUBLE_EQ(w.rows[0].boxes[0].end, 0.45);
  EXPECT_NE(w.title.find("run.json, 0.2 to 0.45 ms: bubble"), std::string::npos) << w.title;
}

TEST(PlotTimeline, BadTraces) {
  EXPECT_THROW(timeline_from_chrome_trace("{not json", "t.json"), IoError);
  EXPECT_THROW(timeline_from_chrome_trace("{\"events\": []}", "t.json"), IoError);
  EXPECT_THROW(timeline_from_chrome_trace("{\"traceEvents\": []}", "t.json"), IoError);
  EXPECT_THROW(
      timeline_from_chrome_trace("{\"traceEvents\": [{\"ph\": \"X\", \"ts\": \"x\"}]}", "t.json"),
      IoError);
  EXPECT_THROW(read_trace_timeline("/nonexistent/trace.json"), IoError);
}

TEST(PlotCurves, MetricsFilesToCurves) {
  const auto dir = train::testing::temp_dir("plot");
  const auto a = dir / "a.jsonl", b = dir / "b.jsonl", bad = dir / "bad.jsonl";
  {
    std::ofstream out(a);
    out << "{\"step\":0,\"val_loss\":5.6}\n{\"step\":1,\"loss\":5.5,\"lr\":0.001}\n"
        << "{\"step\":2,\"loss\":5.0}\n\n{\"step\":3,\"loss\":4.0}\n{\"step\":2,\"loss\":4.8}\n"
        << "{\"step\":3,\"val_loss\":4.2}\n";
    std::ofstream(b) << "{\"step\":1,\"loss\":6}\n{\"step\":2,\"loss\":5}\n";
    std::ofstream(bad) << "{\"step\":1,\"loss\":6}\nnot json\n";
  }
  const Series loss = read_metrics_series(a.string(), "loss", "a");
  ASSERT_EQ(loss.points.size(), 3u);  // steps 1, 2, 3; the later line for step 2 wins
  EXPECT_EQ(loss.points[1], (std::pair<double, double>{2, 4.8}));
  const Series val = read_metrics_series(a.string(), "val_loss", "a val");
  ASSERT_EQ(val.points.size(), 2u);
  EXPECT_EQ(val.points[0], (std::pair<double, double>{0, 5.6}));
  try {
    read_metrics_series(bad.string(), "loss", "bad");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not a JSON line"), std::string::npos);
  }
  EXPECT_THROW(read_metrics_series(b.string(), "val_loss", "b"), ConfigError);
  EXPECT_THROW(read_metrics_series((dir / "none.jsonl").string(), "loss", "x"), IoError);

  CurvesOptions o;
  o.title = "two runs";
  const Series other = read_metrics_series(b.string(), "loss", "run <b>");
  const auto els = parse_xml(curves_svg({loss, val, other}, o));
  EXPECT_EQ(count(els, "polyline"), 3u);
  EXPECT_TRUE(has_text(els, "two runs"));
  EXPECT_TRUE(has_text(els, "a val"));
  EXPECT_TRUE(has_text(els, "run &lt;b&gt;"));
  EXPECT_TRUE(has_text(els, "step"));
  // Axis ticks: steps 0..3 by 0.5, losses 4..6 (padded).
  for (const char* tick : {"0", "1.5", "3", "4", "5", "6"}) {
    bool found = false;
    for (const Element& e : els) found = found || (e.name == "text" && e.text == tick);
    EXPECT_TRUE(found) << tick;
  }
  EXPECT_THROW(curves_svg({}, o), ConfigError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::viz
