#include "tessera/data/oniguruma_syntax.h"

#include <cctype>
#include <vector>

#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

// Length of the interval quantifier {n}, {n,}, {n,m} or {,m} at p[i] ('{'), or 0 if there is none
// there (then '{' is a literal in both engines).
std::size_t interval_length(std::string_view p, std::size_t i) {
  std::size_t j = i + 1, digits = 0, commas = 0;
  for (; j < p.size() && p[j] != '}'; ++j) {
    if (std::isdigit(static_cast<unsigned char>(p[j]))) {
      ++digits;
    } else if (p[j] == ',' && commas == 0) {
      ++commas;
    } else {
      return 0;
    }
  }
  if (j == p.size() || digits == 0) return 0;
  return j - i + 1;
}

// Length of the escape at p[i] ('\\'): \p{..}, \x{..} and the like with their braces, \Q..\E,
// else the backslash and one character.
std::size_t escape_length(std::string_view p, std::size_t i) {
  if (i + 1 >= p.size()) return 1;
  const char c = p[i + 1];
  if (c == 'Q') {
    const std::size_t end = p.find("\\E", i + 2);
    return end == std::string_view::npos ? p.size() - i : end + 2 - i;
  }
  if ((c == 'p' || c == 'P' || c == 'x' || c == 'o' || c == 'k' || c == 'g' || c == 'N') &&
      i + 2 < p.size() && (p[i + 2] == '{' || p[i + 2] == '<')) {
    const std::size_t end = p.find(p[i + 2] == '{' ? '}' : '>', i + 3);
    return end == std::string_view::npos ? p.size() - i : end + 1 - i;
  }
  return 1 + utf8::decode_at(p, i + 1).length;
}

// Length of the character class at p[i] ('['), nested classes and [:posix:] names included.
std::size_t class_length(std::string_view p, std::size_t i) {
  std::size_t j = i + 1;
  if (j < p.size() && p[j] == '^') ++j;
  if (j < p.size() && p[j] == ']') ++j;  // a leading ']' is a literal
  int depth = 1;
  while (j < p.size() && depth > 0) {
    if (p[j] == '\\') {
      j += escape_length(p, j);
    } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':') {
      const std::size_t end = p.find(":]", j + 2);
      j = end == std::string_view::npos ? j + 1 : end + 2;
    } else if (p[j] == '[') {
      ++depth;
      ++j;
    } else if (p[j] == ']') {
      --depth;
      ++j;
    } else {
      ++j;
    }
  }
  return j - i;
}

// A class body with \h written out (Ruby syntax: hexadecimal digits).
std::string class_text(std::string_view cls) {
  std::string out;
  for (std::size_t j = 0; j < cls.size();) {
    if (cls[j] == '\\' && j + 1 < cls.size() && cls[j + 1] == 'h') {
      out += "0-9a-fA-F";
      j += 2;
    } else {
      const std::size_t n = cls[j] == '\\' ? escape_length(cls, j) : 1;
      out.append(cls.substr(j, n));
      j += n;
    }
  }
  return out;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  std::size_t atom = std::string::npos;  // where the last atom starts in `out`
  std::vector<std::size_t> groups;       // where the open groups start in `out`
  for (std::size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      const std::size_t n = escape_length(p, i);
      atom = out.size();
      if (n == 2 && p[i + 1] == 'h') {
        out += "[0-9a-fA-F]";
      } else if (n == 2 && p[i + 1] == 'H') {
        out += "[^0-9a-fA-F]";
      } else {
        out.append(p.substr(i, n));
      }
      i += n;
    } else if (c == '[') {
      const std::size_t n = class_length(p, i);
      atom = out.size();
      out += class_text(p.substr(i, n));
      i += n;
    } else if (c == '(') {
      if (p.substr(i).starts_with("(?#")) {  // a comment: no atom
        const std::size_t end = p.find(')', i);
        const std::size_t n = end == std::string_view::npos ? p.size() - i : end + 1 - i;
        out.append(p.substr(i, n));
        i += n;
        continue;
      }
      groups.push_back(out.size());
      out.push_back(c);
      ++i;
    } else if (c == ')') {
      atom = groups.empty() ? std::string::npos : groups.back();
      if (!groups.empty()) groups.pop_back();
      out.push_back(c);
      ++i;
    } else if (c == '{' && interval_length(p, i) > 0) {
      const std::size_t n = interval_length(p, i);
      const bool repeated = i + n < p.size() && p[i + n] == '+';
      if (repeated && atom != std::string::npos) {
        out.insert(atom, "(?:");
        out.append(p.substr(i, n));
        out.push_back(')');
      } else {
        out.append(p.substr(i, n));
      }
      i += n;  // a following '+' is copied as a quantifier of the group
    } else if (c == '|') {
      atom = std::string::npos;
      out.push_back(c);
      ++i;
    } else if (c == '*' || c == '+' || c == '?') {
      out.push_back(c);  // a quantifier (or its lazy/possessive mark): the atom stays
      ++i;
    } else {
      const std::size_t n = utf8::decode_at(p, i).length;
      atom = out.size();
      out.append(p.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace tessera::data
