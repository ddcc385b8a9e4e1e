// model/checkpoint_dir.h — the checkpoints of a run's output directory:
// model_%08d.bin beside state_%08d.bin (model/checkpoint.h writes both, the
// model first), and the latest step that has both. No model code, so tools
// that only drive the trainer can include it.
#pragma once
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

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

// The latest step with both a model and a state file, or -1.
inline int latest_checkpoint(const std::string& dir) {
    int best = -1;
    DIR* d = opendir(dir.c_str());
    if (!d) return -1;
    while (struct dirent* e = readdir(d)) {
        int step;
        char tail;
        if (sscanf(e->d_name, "state_%8d.bi%c", &step, &tail) == 2 && tail == 'n' &&
            strlen(e->d_name) == strlen("state_00000000.bin") && file_exists(checkpoint_path(dir, "model", step)))
            best = std::max(best, step);
    }
    closedir(d);
    return best;
}

}  // namespace knngpt
