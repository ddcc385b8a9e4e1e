// model/checkpoint_dir.h — the checkpoints of a run's output directory:
// model_%08d.bin beside state_%08d.bin (model/checkpoint.h writes both, the
// model first), the latest step that has both, which of them to keep, and the
// temporary files a killed write leaves. No model code, so tools that only
// drive the trainer can include it.
#pragma once
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

namespace knngpt {

inline std::string checkpoint_path(const std::string& dir, const char* kind, int step) {
    char name[64];
    snprintf(name, sizeof(name), "%s_%08d.bin", kind, step);
    return dir + "/" + name;
}

inline bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}

// The names in dir (none if it cannot be read).
inline std::vector<std::string> directory_names(const std::string& dir) {
    std::vector<std::string> names;
    DIR* d = opendir(dir.c_str());
    if (!d) return names;
    while (struct dirent* e = readdir(d)) names.push_back(e->d_name);
    closedir(d);
    return names;
}

// The step of a name "<kind>_%08d.bin<suffix>" exactly, or -1.
inline int checkpoint_step_of(const std::string& name, const char* kind, const char* suffix = "") {
    const std::string prefix = std::string(kind) + "_", tail = std::string(".bin") + suffix;
    if (name.size() != prefix.size() + 8 + tail.size() || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(prefix.size() + 8, tail.size(), tail) != 0)
        return -1;
    int step = 0;
    for (size_t i = prefix.size(); i < prefix.size() + 8; i++) {
        if (name[i] < '0' || name[i] > '9') return -1;
        step = step * 10 + (name[i] - '0');
    }
    return step;
}

// The steps that have both a model and a state file, ascending.
inline std::vector<int> complete_checkpoints(const std::string& dir) {
    std::vector<int> steps;
    for (const std::string& name : directory_names(dir)) {
        const int step = checkpoint_step_of(name, "state");
        if (step >= 0 && file_exists(checkpoint_path(dir, "model", step))) steps.push_back(step);
    }
    std::sort(steps.begin(), steps.end());
    return steps;
}

// The latest step with both a model and a state file, or -1.
inline int latest_checkpoint(const std::string& dir) {
    const std::vector<int> steps = complete_checkpoints(dir);
    return steps.empty() ? -1 : steps.back();
}

// Removes the "<model|state>_%08d.bin.tmp" files of writes that were killed
// before their rename (no other file); returns the names removed.
inline std::vector<std::string> remove_unfinished_writes(const std::string& dir) {
    std::vector<std::string> removed;
    for (const std::string& name : directory_names(dir))
        if ((checkpoint_step_of(name, "model", ".tmp") >= 0 || checkpoint_step_of(name, "state", ".tmp") >= 0) &&
            std::remove((dir + "/" + name).c_str()) == 0)
            removed.push_back(name);
    std::sort(removed.begin(), removed.end());
    return removed;
}

// Retention, after the checkpoint of `step` was written, as llm.c's -nk and -nm:
// keep the `keep_last` latest complete checkpoints up to `step` (step's own
// among them) and every complete checkpoint whose step is a multiple of
// `major_every` (a major checkpoint, kept for good); remove the files of every
// other step below `step`, the state before the model, so that a kill
// half-way leaves no pair that looks complete. Steps above `step` (another
// run's) are left alone. keep_last 0 keeps everything; major_every 0: no majors.
// llm.c removes the one step `step - keep_last * checkpoint_every` each time;
// this keeps the same set when the steps are multiples of -n, and the right one
// when they are not (the last step of a run, a stop by a signal) and after a
// run killed between the two files. Returns the steps removed.
inline std::vector<int> remove_old_checkpoints(const std::string& dir, int step, int keep_last, int major_every) {
    std::vector<int> removed;
    if (keep_last <= 0) return removed;
    std::set<int> keep;
    std::vector<int> complete = complete_checkpoints(dir);
    complete.erase(std::upper_bound(complete.begin(), complete.end(), step), complete.end());
    for (size_t i = complete.size() > (size_t)keep_last ? complete.size() - keep_last : 0; i < complete.size(); i++)
        keep.insert(complete[i]);
    if (major_every > 0)
        for (int s : complete)
            if (s % major_every == 0) keep.insert(s);
    std::set<int> present;  // every step below `step` with a model or a state file, complete or not
    for (const std::string& name : directory_names(dir))
        for (const char* kind : {"model", "state"}) {
            const int s = checkpoint_step_of(name, kind);
            if (s >= 0 && s < step) present.insert(s);
        }
    for (int s : present) {
        if (keep.count(s)) continue;
        std::remove(checkpoint_path(dir, "state", s).c_str());
        std::remove(checkpoint_path(dir, "model", s).c_str());
        removed.push_back(s);
    }
    return removed;
}

}  // namespace knngpt
