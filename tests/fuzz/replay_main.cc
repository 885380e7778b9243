// The gcc driver of a fuzz target (tests/fuzz/fuzz_target.h): runs the
// target's seeds, every file (or every file in every directory) named on
// the command line, then --mutations inputs made from them by a fixed
// pseudo-random sequence of byte mutations (flips, interesting values,
// deletions, duplications, insertions, truncation, splices), so a run is
// reproducible: the same build replays the same inputs. A crash aborts the
// test; on abort the input being run is in the file named by
// --last_input, to rerun it with the libFuzzer binary.
//
//   NAME_test [--mutations N] [--write_seeds DIR] [--last_input FILE] [PATH...]
//
// --write_seeds DIR writes the target's seeds as files into DIR and exits
// (tools/fuzz.sh starts its corpora from them).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace {

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void WriteFile(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One mutation of `input`, drawn from `rng`; `other` is for splices.
std::string Mutate(std::string input, const std::string& other,
                   std::mt19937_64& rng) {
  auto pick = [&rng](size_t n) {
    return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n);
  };
  static constexpr unsigned char kInteresting[] = {0x00, 0x01, 0x7f, 0x80,
                                                   0xff, 0xfe, 0x40, 0x20};
  switch (rng() % 8) {
    case 0:  // flip one bit
      if (!input.empty()) input[pick(input.size())] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:  // an interesting byte
      if (!input.empty()) {
        input[pick(input.size())] =
            static_cast<char>(kInteresting[pick(sizeof(kInteresting))]);
      }
      break;
    case 2: {  // delete a range
      const size_t at = pick(input.size() + 1);
      input.erase(at, 1 + pick(16));
      break;
    }
    case 3: {  // duplicate a range
      const size_t at = pick(input.size() + 1);
      const std::string piece = input.substr(at, 1 + pick(32));
      input.insert(pick(input.size() + 1), piece);
      break;
    }
    case 4: {  // insert random bytes
      std::string bytes(1 + pick(8), '\0');
      for (char& c : bytes) c = static_cast<char>(rng());
      input.insert(pick(input.size() + 1), bytes);
      break;
    }
    case 5:  // truncate
      input.resize(pick(input.size() + 1));
      break;
    case 6: {  // splice with another input
      const size_t cut = pick(input.size() + 1);
      input = input.substr(0, cut) + other.substr(pick(other.size() + 1));
      break;
    }
    default: {  // overwrite a little-endian varint-ish run with all-ones
      if (!input.empty()) {
        const size_t at = pick(input.size());
        const size_t n = std::min<size_t>(1 + pick(8), input.size() - at);
        std::memset(input.data() + at, 0xff, n);
      }
      break;
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  long mutations = 3000;
  std::string write_seeds;
  std::string last_input;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::cerr << argv[0] << ": " << flag << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--mutations") {
      mutations = std::strtol(value("--mutations"), nullptr, 10);
    } else if (arg == "--write_seeds") {
      write_seeds = value("--write_seeds");
    } else if (arg == "--last_input") {
      last_input = value("--last_input");
    } else if (arg == "-h" || arg == "--help") {
      std::cout << "usage: " << argv[0]
                << " [--mutations N] [--write_seeds DIR] [--last_input FILE] "
                   "[PATH...]\n";
      return 0;
    } else {
      paths.push_back(arg);
    }
  }

  std::vector<std::string> corpus = mpilearn::fuzz::Seeds();
  const size_t seeds = corpus.size();
  if (!write_seeds.empty()) {
    std::filesystem::create_directories(write_seeds);
    for (size_t i = 0; i < corpus.size(); ++i) {
      WriteFile(std::filesystem::path(write_seeds) / ("seed-" + std::to_string(i)),
                corpus[i]);
    }
    std::cout << "wrote " << corpus.size() << " seeds to " << write_seeds << "\n";
    return 0;
  }
  for (const std::string& path : paths) {
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::directory_iterator(path)) {
        if (entry.is_regular_file()) corpus.push_back(ReadFile(entry.path()));
      }
    } else {
      corpus.push_back(ReadFile(path));
    }
  }
  if (corpus.empty()) corpus.push_back("");

  auto run = [&last_input](const std::string& input) {
    if (!last_input.empty()) WriteFile(last_input, input);
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()),
                           input.size());
  };
  for (size_t i = 0; i < corpus.size(); ++i) {
    const long before = mpilearn::fuzz::accepted_inputs;
    run(corpus[i]);
    if (i < seeds && mpilearn::fuzz::accepted_inputs == before) {
      std::cerr << "seed " << i << " was not accepted by the target: the seed "
                   "or the code it exercises is broken\n";
      return 1;
    }
  }
  const long accepted_corpus = mpilearn::fuzz::accepted_inputs;
  std::mt19937_64 rng(20261124);
  for (long i = 0; i < mutations; ++i) {
    std::string input = corpus[rng() % corpus.size()];
    const int rounds = 1 + static_cast<int>(rng() % 4);
    for (int r = 0; r < rounds; ++r) {
      input = Mutate(std::move(input), corpus[rng() % corpus.size()], rng);
    }
    run(input);
  }
  std::cout << "ran " << corpus.size() << " corpus inputs (" << accepted_corpus
            << " accepted) and " << mutations << " mutations ("
            << mpilearn::fuzz::accepted_inputs - accepted_corpus
            << " accepted): no crash\n";
  return 0;
}
