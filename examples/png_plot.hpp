#pragma once
// A dependency-free PNG line plot: an RGB raster, axes with min/max labels in
// a 3x5 pixel font, one polyline per series, written as a PNG whose zlib
// stream uses stored (uncompressed) deflate blocks. Small and exact, not pretty.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace hg::plot {

struct Series {
  std::vector<double> x, y;
  std::array<uint8_t, 3> rgb{31, 119, 180};
};

class Image {
 public:
  Image(int w, int h) : w_(w), h_(h), px_(static_cast<size_t>(w) * h * 3, 255) {}
  void set(int x, int y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
    std::copy(c.begin(), c.end(), px_.begin() + (static_cast<size_t>(y) * w_ + x) * 3);
  }
  void line(int x0, int y0, int x1, int y1, std::array<uint8_t, 3> c) {  // Bresenham
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    for (int err = dx + dy;;) {
      set(x0, y0, c);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) { err += dy; x0 += sx; }
      if (e2 <= dx) { err += dx; y0 += sy; }
    }
  }
  // Digits, '.', '-', 'e', '+' in a 3x5 font scaled by `s`; other characters are blank.
  void text(int x, int y, const std::string& str, int s = 2) {
    static const char* glyphs = "0123456789.-e+";
    static const uint16_t bits[] = {0x7B6F, 0x2C97, 0x73E7, 0x73CF, 0x5BC9, 0x79CF, 0x79EF, 0x7292,
                                    0x7BEF, 0x7BCF, 0x0002, 0x01C0, 0x0FE7, 0x05D0};
    for (char ch : str) {
      const char* g = std::find(glyphs, glyphs + 14, ch);
      if (g != glyphs + 14) {
        const uint16_t b = bits[g - glyphs];
        for (int r = 0; r < 5; ++r)
          for (int col = 0; col < 3; ++col)
            if (b >> (14 - (r * 3 + col)) & 1)
              for (int i = 0; i < s * s; ++i) set(x + col * s + i % s, y + r * s + i / s, {0, 0, 0});
      }
      x += 4 * s;
    }
  }
  bool write_png(const std::string& path) const;

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

namespace detail {
inline uint32_t crc32(const uint8_t* p, size_t n, uint32_t c = 0xFFFFFFFFu) {
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return c;
}
inline void put32(std::vector<uint8_t>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(static_cast<uint8_t>(x >> s));
}
inline void chunk(std::vector<uint8_t>& out, const char* type, const std::vector<uint8_t>& data) {
  put32(out, static_cast<uint32_t>(data.size()));
  std::vector<uint8_t> body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  put32(out, crc32(body.data(), body.size()) ^ 0xFFFFFFFFu);
}
}  // namespace detail

inline bool Image::write_png(const std::string& path) const {
  std::vector<uint8_t> raw;  // each scanline: filter byte 0, then RGB
  for (int y = 0; y < h_; ++y) {
    raw.push_back(0);
    raw.insert(raw.end(), px_.begin() + static_cast<size_t>(y) * w_ * 3, px_.begin() + static_cast<size_t>(y + 1) * w_ * 3);
  }
  std::vector<uint8_t> z{0x78, 0x01};  // zlib header: deflate, 32K window, no dictionary
  for (size_t pos = 0; pos < raw.size() || pos == 0; pos += 65535) {
    const size_t n = std::min<size_t>(65535, raw.size() - pos);
    z.push_back(pos + n >= raw.size() ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    z.push_back(n & 0xFF); z.push_back(n >> 8);
    z.push_back(~n & 0xFF); z.push_back((~n >> 8) & 0xFF);
    z.insert(z.end(), raw.begin() + pos, raw.begin() + pos + n);
  }
  uint32_t a = 1, b = 0;  // Adler-32 of the uncompressed data
  for (uint8_t byte : raw) { a = (a + byte) % 65521; b = (b + a) % 65521; }
  detail::put32(z, (b << 16) | a);

  std::vector<uint8_t> png{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  std::vector<uint8_t> ihdr;
  detail::put32(ihdr, w_);
  detail::put32(ihdr, h_);
  ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // 8-bit RGB, no interlace
  detail::chunk(png, "IHDR", ihdr);
  detail::chunk(png, "IDAT", z);
  detail::chunk(png, "IEND", {});
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(png.data()), static_cast<std::streamsize>(png.size()));
  return static_cast<bool>(f);
}

inline std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

// Plots the series on shared axes (y range from all series) and writes `path`.
// log_y plots log10(y) (non-positive y are skipped) and labels in y units.
inline bool line_plot(const std::string& path, std::vector<Series> series, bool log_y = false, int w = 800,
                      int h = 500) {
  if (log_y)
    for (Series& s : series)
      for (double& y : s.y) y = y > 0 ? std::log10(y) : NAN;
  auto label = [&](double y) { return short_number(log_y ? std::pow(10.0, y) : y); };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i])) {
        x0 = std::min(x0, s.x[i]); x1 = std::max(x1, s.x[i]);
        y0 = std::min(y0, s.y[i]); y1 = std::max(y1, s.y[i]);
      }
  if (!(x0 <= x1)) { x0 = 0; x1 = 1; y0 = 0; y1 = 1; }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  Image img(w, h);
  const int left = 70, right = w - 20, top = 20, bottom = h - 40;
  const std::array<uint8_t, 3> axis{0, 0, 0};
  img.line(left, top, left, bottom, axis);
  img.line(left, bottom, right, bottom, axis);
  img.text(4, top, label(y1));
  img.text(4, bottom - 10, label(y0));
  img.text(left, bottom + 10, short_number(x0));
  img.text(right - 60, bottom + 10, short_number(x1));
  auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x0) / (x1 - x0) * (right - left))); };
  auto py = [&](double y) { return bottom - static_cast<int>(std::lround((y - y0) / (y1 - y0) * (bottom - top))); };
  for (const Series& s : series) {
    bool have = false;
    int lx = 0, ly = 0;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!std::isfinite(s.y[i])) { have = false; continue; }
      const int cx = px(s.x[i]), cy = py(s.y[i]);
      if (have) img.line(lx, ly, cx, cy, s.rgb); else img.set(cx, cy, s.rgb);
      lx = cx; ly = cy; have = true;
    }
  }
  return img.write_png(path);
}

}  // namespace hg::plot
