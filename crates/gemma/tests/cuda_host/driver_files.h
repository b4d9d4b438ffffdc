// Reading the drivers' input files.
#include <cstdio>
#include <cstdlib>
#include <vector>

// The bytes of the file at `path` followed by `extra` zero bytes (room to
// align a copy); exits with status 2, naming the file, if it cannot be read.
static std::vector<unsigned char> read_all(const char* path, size_t extra) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) { std::perror(path); std::exit(2); }
  std::vector<unsigned char> out;
  unsigned char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + n);
  std::fclose(f);
  out.resize(out.size() + extra);
  return out;
}
