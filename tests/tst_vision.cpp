// The vision plugin on real JPEGs from other projects, and the image operators' semantics.
#include <QtTest>

#include <filesystem>
#include <set>
#include <opencv2/imgproc.hpp>

#include "image_codec.hpp"
#include "pixel_ops.hpp"
#include "pipeline_runner.hpp"
#include "sluice/core/param_parse.hpp"

using namespace sluice::test;
namespace fs = std::filesystem;

namespace {
std::string jpeg_dir() { return testdata_dir() + "/jpeg"; }
std::string bytes_of(const std::string& path) { return read_file(path); }
RunOutput run_ok(const std::string& text) {
  auto out = run_text(text);
  if (!out.error.empty() || out.result.state != sluice::RunState::Finished)
    qFatal("pipeline did not finish: %s %s", out.error.c_str(), out.result.error.c_str());
  return out;
}
// Every number of the image field of a jsonl line, in order.
std::vector<double> floats(const std::string& line, const std::string& field = "image") {
  std::vector<double> out;
  std::size_t at = line.find("\"" + field + "\":") + field.size() + 3;
  int depth = 0;
  for (std::size_t i = at; i < line.size(); ++i) {
    char c = line[i];
    if (c == '[') ++depth;
    else if (c == ']') {
      if (--depth == 0) break;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      char* end = nullptr;
      out.push_back(std::strtod(line.c_str() + i, &end));
      i = static_cast<std::size_t>(end - line.c_str()) - 1;
    }
  }
  return out;
}
// The shape of the image field of a jsonl line: rows, columns, channels.
std::vector<int> image_shape(const std::string& line, const std::string& field = "image") {
  auto at = line.find("\"" + field + "\":") + field.size() + 3;
  int depth = 0;
  std::vector<int> counts(3, 0);
  std::vector<bool> first(3, true);
  for (std::size_t i = at; i < line.size(); ++i) {
    char c = line[i];
    if (c == '[') {
      ++depth;
      if (depth <= 3 && first[depth - 1]) counts[depth - 1] = 1;
    } else if (c == ']') {
      if (depth <= 3) first[depth - 1] = false;
      if (--depth == 0) break;
    } else if (c == ',' && depth >= 1 && depth <= 3 && first[depth - 1]) {
      ++counts[depth - 1];
    }
  }
  return counts;
}
}  // namespace

class TestVision : public QObject {
  Q_OBJECT
 private slots:
  void initTestCase() {
    QVERIFY2(fs::is_directory(jpeg_dir()),
             qPrintable(QString::fromStdString("test data not found under " + testdata_dir() + " (set SLUICE_TESTDATA)")));
  }

  void every_real_jpeg_decodes_or_fails_clearly() {
    const std::set<std::string> expected_failures = {"crashtest_empty.jpg", "jpeg_lossless_sel1.jpg", "monkey12.jpg",
                                                     "truncated_jpeg.jpg"};
    int decoded = 0;
    for (const auto& entry : fs::recursive_directory_iterator(jpeg_dir())) {
      if (entry.path().extension() != ".jpg") continue;
      std::string name = entry.path().filename().string();
      sluice::vision::DecodeOptions options;
      try {
        cv::Mat img = sluice::vision::decode_image(bytes_of(entry.path().string()), options);
        QVERIFY2(!expected_failures.count(name), name.c_str());
        QVERIFY(img.rows > 0 && img.cols > 0 && img.channels() == 3 && img.depth() == CV_8U);
        ++decoded;
      } catch (const sluice::DataError& e) {
        QVERIFY2(expected_failures.count(name), qPrintable(QString::fromStdString(name + ": " + e.what())));
        std::string what = e.what();
        QVERIFY(what.find("empty") != std::string::npos || what.find("precision 12") != std::string::npos ||
                what.find("SOF type 0xc3") != std::string::npos || what.find("ends before its last scan") != std::string::npos);
      }
    }
    QCOMPARE(decoded, 48);
  }

  void sizes_channels_and_orientation() {
    auto decode = [](const std::string& rel, int channels = 3, bool orient = true) {
      sluice::vision::DecodeOptions o;
      o.channels = channels;
      o.apply_orientation = orient;
      return sluice::vision::decode_image(bytes_of(jpeg_dir() + "/" + rel), o);
    };
    cv::Mat tall = decode("jpeg-decoder/grayscale_long.jpg", 0);
    QCOMPARE(tall.cols, 1);
    QCOMPARE(tall.rows, 1000);
    QCOMPARE(tall.channels(), 1);
    QCOMPARE(decode("jpeg-decoder/tower.jpg").size(), cv::Size(512, 512));
    QCOMPARE(decode("jpeg-decoder/ycck.jpg").size(), cv::Size(500, 333));  // YCCK through OpenCV
    QCOMPARE(decode("libjpeg-turbo/testimgari.jpg").size(), cv::Size(227, 149));  // arithmetic coding
    sluice::vision::DecodeOptions accept;
    accept.accept_truncated = true;  // decodes with its missing part grey only when asked to
    QCOMPARE(sluice::vision::decode_image(bytes_of(jpeg_dir() + "/pillow/truncated_jpeg.jpg"), accept).size(), cv::Size(100, 100));
    QCOMPARE(sluice::vision::exif_orientation(bytes_of(jpeg_dir() + "/pillow/hopper_orientation_6.jpg")), 6);
    cv::Mat raw = decode("pillow/hopper_orientation_6.jpg", 3, false), oriented = decode("pillow/hopper_orientation_6.jpg");
    cv::Mat rotated;
    cv::rotate(raw, rotated, cv::ROTATE_90_CLOCKWISE);
    QCOMPARE(cv::norm(oriented, rotated, cv::NORM_INF), 0.0);
  }

  void dct_scaling_decodes_just_large_enough() {
    sluice::vision::DecodeOptions o;
    o.target_height = o.target_width = 100;
    cv::Mat small = sluice::vision::decode_image(bytes_of(jpeg_dir() + "/jpeg-decoder/tower.jpg"), o);
    QCOMPARE(small.size(), cv::Size(128, 128));  // 1/4 scale: 1/8 would be 64, too small
  }

  void dct_scaling_covers_non_square_targets_both_ways() {
    // large_image.jpg is 2268x1512. The scale must cover both sides of the target: a tall target
    // needs the height (3/8: 851x567, as 1/4's 378 rows are too few), a wide one the width (1/4).
    const std::string bytes = bytes_of(jpeg_dir() + "/jpeg-decoder/large_image.jpg");
    sluice::vision::DecodeOptions tall;
    tall.target_width = 100;
    tall.target_height = 400;
    QCOMPARE(sluice::vision::decode_image(bytes, tall).size(), cv::Size(851, 567));
    sluice::vision::DecodeOptions wide;
    wide.target_width = 400;
    wide.target_height = 100;
    QCOMPARE(sluice::vision::decode_image(bytes, wide).size(), cv::Size(567, 378));
    // The same picture marked "rotate 90°" (EXIF orientation 6, the APP1 segment Pillow wrote in
    // hopper_orientation_6.jpg, put after the SOI): it shows as 1512x2268, so the tall target
    // now needs the stored width (1/4, shown as 378x567) and the wide one the stored height (3/8).
    const std::string exif_source = bytes_of(jpeg_dir() + "/pillow/hopper_orientation_6.jpg");
    const auto app1 = exif_source.find("\xFF\xE1");
    QVERIFY(app1 != std::string::npos);
    const auto app1_size = 2 + ((std::size_t(std::uint8_t(exif_source[app1 + 2])) << 8) | std::uint8_t(exif_source[app1 + 3]));
    const std::string rotated = bytes.substr(0, 2) + exif_source.substr(app1, app1_size) + bytes.substr(2);
    QCOMPARE(sluice::vision::decode_image(rotated, sluice::vision::DecodeOptions{}).size(), cv::Size(1512, 2268));
    QCOMPARE(sluice::vision::decode_image(rotated, tall).size(), cv::Size(378, 567));
    QCOMPARE(sluice::vision::decode_image(rotated, wide).size(), cv::Size(567, 851));
  }

  void decode_takes_its_dct_target_from_a_later_resize() {
    auto target_of = [](const std::string& between, const std::string& decode_params = "",
                        std::vector<std::pair<std::string, std::string>> between_params = {}) {
      std::string text = stage("src", "synthetic_images", "", {{"count", "2"}}) + stage("enc", "encode_image", "src") +
                         "stage { id: \"decode\" op: \"decode_image\" input: \"enc\" " + decode_params + " }\n";
      std::string last = "decode";
      if (!between.empty()) {
        text += stage("mid", between, "decode", between_params);
        last = "mid";
      }
      text += stage("resize", "resize", last, {{"height", "100"}, {"width", "120"}}) + stage("out", "null_sink", "resize");
      const auto graph = graph_of(text);
      for (const auto& st : graph.stages)
        if (st.id == "decode") return std::pair{st.params.get_int("target_height"), st.params.get_int("target_width")};
      return std::pair<std::int64_t, std::int64_t>{-1, -1};
    };
    using Size = std::pair<std::int64_t, std::int64_t>;
    QCOMPARE(target_of(""), Size(100, 120));
    // Through stages that keep shapes...
    QCOMPARE(target_of("random_flip"), Size(100, 120));
    QCOMPARE(target_of("normalize"), Size(100, 120));
    // ...but not through one that may crop a small part (full resolution is needed there).
    QCOMPARE(target_of("random_resized_crop", "", {{"height", "300"}, {"width", "300"}}), Size(0, 0));
    // What the user writes wins, 0 (full size) included.
    QCOMPARE(target_of("", "params { key: \"target_height\" value: \"0\" }"), Size(0, 120));
    // validate reports where the value came from.
    const auto graph = graph_of(stage("src", "synthetic_images", "", {}) + stage("enc", "encode_image", "src") +
                                stage("decode", "decode_image", "enc") + stage("resize", "resize", "decode", {{"height", "64"}, {"width", "64"}}) +
                                stage("out", "null_sink", "resize"));
    QCOMPARE(graph.stages[2].notes.size(), std::size_t(2));
    QCOMPARE(graph.stages[2].notes[0], std::string("target_height = 64, from stage 'resize' (height)"));
  }

  void pixel_limit_refuses_bombs() {
    std::string big = bytes_of(jpeg_dir() + "/jpeg-js/black-6000x6000.jpg");
    sluice::vision::DecodeOptions strict;
    strict.max_pixels = 10000000;
    try {
      sluice::vision::decode_image(big, strict);
      QFAIL("not refused");
    } catch (const sluice::DataError& e) {
      QVERIFY(std::string(e.what()).find("6000x6000 = 36000000 pixels, over max_pixels 10000000") != std::string::npos);
    }
    cv::Mat img = sluice::vision::decode_image(big, sluice::vision::DecodeOptions{});
    QCOMPARE(img.size(), cv::Size(6000, 6000));
  }

  void damaged_dicom_is_refused_not_fatal() {
    // A fuzzer's file: "DICM" at byte 128 sends it to OpenCV's GDCM reader, whose assertion ended
    // the process; decode_image refuses DICOM as a data error (skipped under error_policy skip).
    std::string dicom(128, '\xda');
    dicom.replace(0, 2, "P5");
    dicom += "DICM";
    try {
      sluice::vision::decode_image(dicom, sluice::vision::DecodeOptions{});
      QFAIL("not refused");
    } catch (const sluice::DataError& e) {
      QVERIFY2(std::string(e.what()).find("DICOM images are not decoded") != std::string::npos, e.what());
    }
  }

  void pets_images_match_their_stored_size() {
    auto out = run_ok(stage("files", "list_files", "", {{"patterns", testdata_dir() + "/tfrecord/pets_examples.record"}}) +
                      stage("read", "tfrecord_reader", "files") +
                      stage("parse", "parse_example", "read", {{"features", "image/encoded:bytes, image/height:int64, image/width:int64"}}) +
                      stage("dec", "decode_image", "parse", {{"field", "image/encoded"}}, "parallelism: 2") + sink_after("dec"));
    QCOMPARE(out.lines.size(), std::size_t(10));
    for (const auto& line : out.lines) {
      auto height = std::strtoll(line.c_str() + line.find("\"image/height\":") + 15, nullptr, 10);
      auto width = std::strtoll(line.c_str() + line.find("\"image/width\":") + 14, nullptr, 10);
      auto shape = image_shape(line);
      QCOMPARE(shape[0], static_cast<int>(height));
      QCOMPARE(shape[1], static_cast<int>(width));
      QCOMPARE(shape[2], 3);
    }
  }

  void random_flip_mirrors_the_axis_it_names() {
    // Pixel by pixel with p: 1 (two flips restoring the image holds for any axis, so it proves nothing).
    const int H = 5, W = 7, C = 3;
    sluice::Tensor image = sluice::Tensor::empty(sluice::DType::U8, {H, W, C});
    auto* in = image.data<std::uint8_t>();
    for (int i = 0; i < H * W * C; ++i) in[i] = static_cast<std::uint8_t>(i);
    const auto op_info = sluice::test::registry().find("random_flip");
    QVERIFY(op_info);
    for (std::string direction : {"horizontal", "vertical"}) {
      auto op = op_info->info.create(sluice::parse_params(op_info->info.params, {{"p", "1"}, {"direction", direction}}));
      sluice::StageInfo stage_info;
      stage_info.id = "flip";
      op->start(stage_info);
      sluice::Sample sample;
      sample.set("image", image);
      sluice::Sample flipped = dynamic_cast<sluice::Map&>(*op).map(sample, sluice::ElementContext{&stage_info, 0, 0});
      const sluice::Tensor& result = flipped.at("image");
      QCOMPARE(result.shape(), (sluice::Shape{H, W, C}));
      const auto* out = result.data<std::uint8_t>();
      for (int r = 0; r < H; ++r)
        for (int c = 0; c < W; ++c)
          for (int ch = 0; ch < C; ++ch) {
            const int from_r = direction == "vertical" ? H - 1 - r : r, from_c = direction == "horizontal" ? W - 1 - c : c;
            QCOMPARE(out[(r * W + c) * C + ch], in[(from_r * W + from_c) * C + ch]);
          }
    }
  }

  void undecodable_image_names_its_origin() {
    auto out = run_text(stage("files", "list_files", "", {{"patterns", jpeg_dir() + "/jpeg-decoder/crashtest_empty.jpg"}}) +
                        stage("read", "read_file", "files") + stage("dec", "decode_image", "read") +
                        stage("out", "null_sink", "dec"));
    QCOMPARE(out.result.state, sluice::RunState::Failed);
    QVERIFY2(out.result.error.find("from " + jpeg_dir() + "/jpeg-decoder/crashtest_empty.jpg: the image is empty") != std::string::npos,
             out.result.error.c_str());
  }

  void resize_modes_and_crops_give_the_requested_size() {
    std::string src = stage("src", "synthetic_images", "", {{"count", "2"}, {"height", "60"}, {"width", "100"}});
    for (std::string mode : {"stretch", "crop", "pad"}) {
      auto out = run_ok(src + stage("r", "resize", "src", {{"height", "32"}, {"width", "48"}, {"mode", mode}}) + sink_after("r"));
      QCOMPARE(image_shape(out.lines[0]), (std::vector<int>{32, 48, 3}));
    }
    auto crop = run_ok(src + stage("c", "random_resized_crop", "src", {{"height", "24"}, {"width", "24"}}) + sink_after("c"));
    QCOMPARE(image_shape(crop.lines[1]), (std::vector<int>{24, 24, 3}));
  }

  void flips_normalize_transpose_cast() {
    std::string src = stage("src", "synthetic_images", "", {{"count", "1"}, {"height", "4"}, {"width", "6"}});
    auto plain = run_ok(src + sink_after("src"));
    auto twice = run_ok(src + stage("f1", "random_flip", "src", {{"p", "1"}}) + stage("f2", "random_flip", "f1", {{"p", "1"}}) + sink_after("f2"));
    QCOMPARE(twice.lines, plain.lines);
    auto once = run_ok(src + stage("f1", "random_flip", "src", {{"p", "1"}}) + sink_after("f1"));
    QVERIFY(once.lines != plain.lines);
    auto chw = run_ok(src + stage("n", "normalize", "src", {{"mean", "0"}, {"std", "1"}, {"scale", "1"}}) +
                      stage("t", "transpose", "n", {{"to", "chw"}}) + stage("c", "cast", "t", {{"dtype", "u8"}}) +
                      stage("back", "transpose", "c", {{"to", "hwc"}}) + sink_after("back"));
    QCOMPARE(chw.lines, plain.lines);  // a lossless round trip through f32 and CHW
    auto shape = run_ok(src + stage("t", "transpose", "src") + sink_after("t"));
    QCOMPARE(image_shape(shape.lines[0]), (std::vector<int>{3, 4, 6}));
  }

  void one_pass_normalize_matches_opencv() {
    // The u8 fast path against the convertTo/subtract/multiply formulation, on a real photo.
    std::string src = stage("src", "synthetic_images", "", {{"count", "1"}, {"height", "37"}, {"width", "41"}});
    auto u8 = run_ok(src + stage("n", "normalize", "src") + sink_after("n"));
    auto via_f32 = run_ok(src + stage("c", "cast", "src", {{"dtype", "f32"}}) + stage("n", "normalize", "c") + sink_after("n"));
    auto a = floats(u8.lines[0]), b = floats(via_f32.lines[0]);
    QCOMPARE(a.size(), std::size_t(37 * 41 * 3));
    QCOMPARE(a.size(), b.size());
    for (std::size_t i = 0; i < a.size(); ++i)
      QVERIFY2(std::abs(a[i] - b[i]) <= 1e-5 * std::max(1.0, std::abs(b[i])), qPrintable(QString("value %1: %2 vs %3").arg(i).arg(a[i]).arg(b[i])));
  }

  void normalizing_into_a_batch_row_gives_the_same_floats() {
    // The kernel for batch rows (non-temporal stores) against the plain one: every channel count,
    // lengths that end mid-period, and destinations off the 16-byte grid.
    const float mul[4] = {0.5f, -2.0f, 1.0f / 255, 3.25f}, add[4] = {-1.0f, 0.25f, 7.0f, -0.125f};
    std::vector<std::uint8_t> src(1000);
    for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 37 + 11);
    for (int channels = 1; channels <= 4; ++channels)
      for (std::size_t pixels : {0, 1, 7, 8, 31, 200})
        for (std::size_t misalign : {0, 1, 3}) {
          std::vector<float> plain(pixels * channels + 4, -99.0f), cold(pixels * channels + 8, -99.0f);
          float* aligned = cold.data() + (4 - (reinterpret_cast<std::uintptr_t>(cold.data()) / sizeof(float)) % 4) % 4;
          float* dst = aligned + misalign;
          sluice::vision::normalize_u8(src.data(), plain.data(), pixels, channels, mul, add);
          sluice::vision::normalize_u8_to_cold(src.data(), dst, pixels, channels, mul, add);
          for (std::size_t i = 0; i < pixels * channels; ++i)
            QVERIFY2(plain[i] == dst[i], qPrintable(QString("channels %1, pixels %2, value %3").arg(channels).arg(pixels).arg(i)));
          QCOMPARE(dst[pixels * channels], -99.0f);  // nothing written past the end
        }
    // And through the pipeline: normalize before a batch builds in the batch's rows.
    std::string src_stage = stage("src", "synthetic_images", "", {{"count", "6"}, {"height", "33"}, {"width", "29"}});
    auto fused = run_ok(src_stage + stage("n", "normalize", "src", {}, "parallelism: 2") + stage("b", "batch", "n", {{"batch_size", "3"}}) +
                        sink_after("b"));
    auto apart = run_ok(src_stage + stage("n", "normalize", "src", {}, "parallelism: 2") + stage("c", "cast", "n", {{"dtype", "f32"}}) +
                        stage("b", "batch", "c", {{"batch_size", "3"}}) + sink_after("b"));
    QCOMPARE(fused.lines.size(), std::size_t(2));
    QCOMPARE(fused.lines, apart.lines);
  }

  void encode_decode_round_trip() {
    std::string src = stage("src", "synthetic_images", "", {{"count", "2"}, {"height", "40"}, {"width", "50"}});
    auto plain = run_ok(src + sink_after("src"));
    auto png = run_ok(src + stage("e", "encode_image", "src", {{"format", "png"}}) + stage("d", "decode_image", "e") + sink_after("d"));
    QCOMPARE(png.lines, plain.lines);  // PNG is lossless
    auto jpeg = run_ok(src + stage("e", "encode_image", "src", {{"quality", "95"}}) + stage("d", "decode_image", "e") + sink_after("d"));
    QCOMPARE(image_shape(jpeg.lines[0]), (std::vector<int>{40, 50, 3}));
  }

  void synthetic_images_are_deterministic() {
    std::string text = stage("src", "synthetic_images", "", {{"count", "3"}, {"height", "8"}, {"width", "8"}}) + sink_after("src");
    auto a = run_ok("options { seed: 5 }\n" + text), b = run_ok("options { seed: 5 }\n" + text), c = run_ok("options { seed: 6 }\n" + text);
    QCOMPARE(a.lines, b.lines);
    QVERIFY(a.lines != c.lines);
  }
};

QTEST_APPLESS_MAIN(TestVision)
#include "tst_vision.moc"
