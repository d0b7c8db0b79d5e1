// Opens a report in headless Chromium, as a user's browser would: fails on
// any console message from the page (it has no scripts and loads nothing, so
// any message is an error) and on a blank or colourless screenshot. Skipped
// (exit 77) where chromium is not installed.
//   report_browser REPORT.html WORKDIR
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct image {
  uint32_t width = 0, height = 0;
  std::vector<std::array<uint8_t, 3>> pixels;  // row-major RGB
};

uint32_t be32(const std::string& s, std::size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

// The PNGs Chromium writes: 8-bit RGB or RGBA, not interlaced.
image decode_png(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string s{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (s.size() < 33 || s.compare(1, 3, "PNG") != 0) throw std::runtime_error(file + ": not a PNG");
  image img;
  img.width = be32(s, 16);
  img.height = be32(s, 20);
  const int depth = uint8_t(s[24]), colour = uint8_t(s[25]), interlace = uint8_t(s[28]);
  if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0)
    throw std::runtime_error(file + ": unsupported PNG layout");
  const std::size_t channels = colour == 6 ? 4 : 3;
  std::string idat;
  for (std::size_t at = 8; at + 8 <= s.size();) {
    const uint32_t len = be32(s, at);
    const std::string type = s.substr(at + 4, 4);
    if (type == "IDAT") idat += s.substr(at + 8, len);
    at += 12 + len;
  }
  const std::size_t stride = img.width * channels;
  std::vector<uint8_t> raw((stride + 1) * img.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) !=
          Z_OK ||
      raw_len != raw.size())
    throw std::runtime_error(file + ": bad image data");
  std::vector<uint8_t> prev(stride, 0), row(stride);
  img.pixels.reserve(std::size_t(img.width) * img.height);
  for (uint32_t y = 0; y < img.height; ++y) {
    const uint8_t filter = raw[y * (stride + 1)];
    const uint8_t* src = &raw[y * (stride + 1) + 1];
    for (std::size_t i = 0; i < stride; ++i) {
      const int a = i >= channels ? row[i - channels] : 0, b = prev[i],
                c = i >= channels ? prev[i - channels] : 0;
      int v = src[i];
      switch (filter) {
        case 1:
          v += a;
          break;
        case 2:
          v += b;
          break;
        case 3:
          v += (a + b) / 2;
          break;
        case 4:
          v += paeth(a, b, c);
          break;
        default:
          break;
      }
      row[i] = uint8_t(v);
    }
    for (uint32_t x = 0; x < img.width; ++x)
      img.pixels.push_back({row[x * channels], row[x * channels + 1], row[x * channels + 2]});
    prev = row;
  }
  return img;
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser", "google-chrome"}) {
    for (std::string dir : {"/usr/bin/", "/usr/local/bin/", "/snap/bin/"})
      if (::access((dir + name).c_str(), X_OK) == 0) return dir + name;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: report_browser REPORT.html WORKDIR\n";
    return 2;
  }
  const std::string chromium = find_chromium();
  if (chromium.empty()) {
    std::cout << "SKIPPED: chromium is not installed (scripts/install-deps.sh installs it)\n";
    return 77;
  }
  const fs::path report = fs::absolute(argv[1]), work = fs::absolute(argv[2]);
  fs::create_directories(work);
  const fs::path shot = work / "report.png", log = work / "chromium.log";
  fs::remove(shot);
  // Its own profile directory, no sandbox (CI runs as root), killed after 60 s.
  const std::string cmd = "timeout -k 5 60 " + chromium +
                          " --headless --no-sandbox --disable-gpu --hide-scrollbars"
                          " --no-first-run --user-data-dir=" +
                          (work / "profile").string() +
                          " --window-size=1280,2200 --enable-logging=stderr --v=0"
                          " --screenshot=" +
                          shot.string() + " file://" + report.string() + " > " + log.string() +
                          " 2>&1";
  const int rc = std::system(cmd.c_str());
  std::ifstream lin(log);
  std::string line, problems;
  while (std::getline(lin, line))
    if (line.find("CONSOLE") != std::string::npos || line.find("Uncaught") != std::string::npos ||
        line.find("Failed to load resource") != std::string::npos)
      problems += line + "\n";
  fs::remove_all(work / "profile");
  if (rc != 0 || !fs::exists(shot)) {
    std::cerr << "FAIL: chromium exited with " << rc << " and no screenshot; its log:\n"
              << std::ifstream(log).rdbuf();
    return 1;
  }
  if (!problems.empty()) {
    std::cerr << "FAIL: the page wrote to the console:\n" << problems;
    return 1;
  }
  const image img = decode_png(shot.string());
  std::size_t ink = 0;
  std::set<uint32_t> colours;
  bool first_run = false, second_run = false;  // the palette's first two colours
  for (const auto& p : img.pixels) {
    const uint32_t rgb = (uint32_t(p[0]) << 16) | (uint32_t(p[1]) << 8) | p[2];
    if (p[0] < 235 || p[1] < 235 || p[2] < 235) ++ink;
    colours.insert(rgb);
    first_run = first_run || rgb == 0x0072B2;
    second_run = second_run || rgb == 0xD55E00;
  }
  const double ink_share = double(ink) / double(img.pixels.size());
  std::cout << "screenshot " << img.width << "x" << img.height << ": " << 100 * ink_share
            << "% ink, " << colours.size() << " colours, series colours " << (first_run ? "1 " : "")
            << (second_run ? "2" : "") << "\n";
  if (ink_share < 0.03 || colours.size() < 16) {
    std::cerr << "FAIL: the page looks blank\n";
    return 1;
  }
  if (!first_run || !second_run) {
    std::cerr << "FAIL: the two runs' series colours are not on screen\n";
    return 1;
  }
  return 0;
}
