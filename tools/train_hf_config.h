/* What weights from Hugging Face cannot say in their tensors: a GPT-2's number of attention heads. The split of the
 * hidden size into heads leaves every tensor's shape as it is, so a wrong --heads would load and train silently
 * with other attention; the config.json that save_pretrained writes beside the weights gives it. */
#ifndef STRATA_TOOLS_TRAIN_HF_CONFIG_H
#define STRATA_TOOLS_TRAIN_HF_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

typedef enum hf_heads_verdict {
    HF_HEADS_AGREE,     /* config.json names the model's number of heads */
    HF_HEADS_UNCHECKED, /* no config.json beside the weights, or one without a head count: said in the header */
    HF_HEADS_DIFFER     /* why says what config.json holds and the flag to set */
} hf_heads_verdict;

/* Compares heads with the config.json beside weights_path (a directory: inside it; a file: in its directory);
 * config_path receives the file looked at. */
hf_heads_verdict hf_config_check_heads(const char *weights_path, int heads, char *config_path, size_t path_len,
                                       char *why, size_t why_len);

#endif
